"""Reading the exporter's history back: from Prometheus's HTTP API, or from a file of
samples in the Prometheus text or OpenMetrics format (`gpuslice advise`)."""
