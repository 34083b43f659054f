"""spectune-sim: a fleet of engine pods and the operator tuning it, in virtual time."""
