"""The operator's demo: a local cluster, Prometheus, engines and the operator moving thresholds
as the fleet and the traffic change (`make demo`)."""
