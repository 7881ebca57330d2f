"""The broker domain, without I/O: logs, groups, deliveries, settlement."""
