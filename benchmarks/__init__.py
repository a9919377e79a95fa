"""astraflow.benchmarks"""
