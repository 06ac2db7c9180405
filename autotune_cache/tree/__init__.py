"""tree"""
