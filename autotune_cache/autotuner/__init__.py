"""autotuner"""
