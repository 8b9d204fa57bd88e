"""Test utilities shared by the tests, the benchmarks and the local stack: in-process allocator
replicas, the fake NVML and its fleet scenarios, a fake kubelet, a headless browser.

Nothing here is imported by a service at run time, except the local stack's fakes at the seams.
"""
