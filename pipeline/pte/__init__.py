"""ExecuTorch's program and its checks, shared by both runtimes: the framing and flatbuffer
(`file`), structure/shape/dtype checks (`verify`, with the operator table of `operators`), the
call's input checks (`inputs`) and XNNPACK's payloads (`xnnpack_payload`). Our own delegate's
format is `pipeline.blob`.
"""
