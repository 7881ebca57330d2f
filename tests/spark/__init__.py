"""Tests of the PySpark connector (pyspark_minou); skipped when pyspark is missing."""
