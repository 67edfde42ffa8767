"""WGSL kernels, shipped as package data and loaded with importlib.resources."""
