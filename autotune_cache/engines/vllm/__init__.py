"""engines.vllm"""
