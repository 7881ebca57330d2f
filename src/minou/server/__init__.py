"""Thin asyncio adapters around the core: TCP, WebSocket, HTTP, lifecycle."""
