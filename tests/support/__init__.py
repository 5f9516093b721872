"""Shared helpers of the tests: node configs, HTTP and gRPC clients, inputs, scrapes (not collected as tests)."""
