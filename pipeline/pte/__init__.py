"""ExecuTorch's program and its checks, shared by both runtimes: the framing and flatbuffer
(`file`), structure/shape/dtype checks (`verify`, with the operator table of `operators`), the
call's input checks (`inputs`), XNNPACK's payloads (`xnnpack_payload`) and bundled programs
(`bundle`), those two read with classes flatc generates from the installed schemas (`flatc`).
Our own delegate's format is `pipeline.blob`.
"""
