"""`spectune-engine bench`: the batch sweep, the load generator and its targets (an
in-process engine or any OpenAI URL), workloads and the report."""
