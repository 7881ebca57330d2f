"""Storage backends behind one small interface (``base.Storage``)."""
