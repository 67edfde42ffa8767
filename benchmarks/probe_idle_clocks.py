"""Does a pause on the host slow the next timing, and does WARM_SECONDS of launches first
undo it? (H200: its SMs idle at 345 MHz.) Times the WGSL copy and the kernel at one shape
after host pauses of 0, 0.5 and 2 s, without the timed warm-up (only the 10 warm-up
launches inside the timed command buffer, as until now) and with it.

    OUT=dir python benchmarks/probe_idle_clocks.py   # dir/idle_clocks.json
"""
import json
import os
import time

from pipeline import benchmark

ROWS, WIDTH = 8192, 1024  # its WGSL copy takes 18.5-18.7 us on an undisturbed H200
warm = benchmark.WARM_SECONDS
results = []
for warm_seconds in (0.0, warm, 0.0, warm):
    benchmark.WARM_SECONDS = warm_seconds
    for pause in (0.0, 0.5, 2.0):
        time.sleep(pause)
        copy = benchmark.time_copy(ROWS, WIDTH, repeats=200)
        time.sleep(pause)
        (kernel, _), = benchmark.time_kernel(ROWS, WIDTH, repeats=200)[0]
        results.append({"warm_seconds": warm_seconds, "pause_s": pause, "copy_us": round(copy, 3),
                        "kernel_us": round(kernel, 3)})
        print(results[-1], flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "idle_clocks.json"), "w") as f:
    json.dump({"shape": [ROWS, WIDTH], "results": results}, f, indent=1)
