"""The Python client: asyncio first (``aio``), with a blocking facade (``sync``)."""
