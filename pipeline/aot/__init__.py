"""Ahead of time: graph passes, the LayerNorm partitioner, the backend's `preprocess` (the
delegate blob), lowering to a serialized program, and `export_model`'s checked write.

Never touches a GPU: what the runtimes need travels in the blob (pipeline.blob).
"""
