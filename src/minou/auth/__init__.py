"""Client identity: key pairs, self-signed short-lived tokens (issue #3, in progress)."""
