"""falkirk: rollback recovery for Spark pipelines with a fault-tolerance regime per region."""
