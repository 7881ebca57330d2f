"""The deterministic simulator (issue 16): the real engine and core over a simulated
clock, storage and clients, every choice drawn from one seed. See docs/testing.md."""
