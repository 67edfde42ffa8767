"""The `.pte` file and its checks, shared by both runtimes: the framing and flatbuffer
(`file`), the delegate blob (`blob`), structure/shape/dtype checks (`verify`, with the
operator table of `operators`), XNNPACK payload checks and the call's input checks.
"""
