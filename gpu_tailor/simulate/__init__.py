"""Trace replay: turns the Alibaba openb CSVs into nodes and asks and drives gpumodel's placement."""
