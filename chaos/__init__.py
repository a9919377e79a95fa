"""Fault injection and the invariant checker that audits a job's topics afterwards."""
