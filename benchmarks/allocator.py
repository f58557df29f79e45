"""Memory measurement shared by the benchmarks (light: imported in LXT's environment too)."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any


def release_freed_memory() -> None:
    """Return freed heap memory to the system (glibc keeps it otherwise), so that the resident
    size before a call is what is really in use."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def allocated_peak_of_call(run: Callable[[], Any]) -> float:
    """The highest total of the bytes torch's CPU allocator handed out during the call and had
    not yet got back, in MB: the allocator's own statistics, as it reports them to the profiler
    (it counts only what it allocates while the profiler records memory).

    Unlike the resident size this does not depend on how the C library's malloc places and
    returns memory (glibc keeps freed blocks resident and splits its heap differently for
    different orders of allocation, which moves the resident peak of one and the same
    computation by tens of MB). It leaves out memory that does not come from torch's allocator
    (oneDNN's scratch buffers, Python objects)."""
    totals = [event["Total Allocated"] for event in _memory_events(run)]
    return max(totals, default=0) / 2**20


def allocated_growth_of_call(run: Callable[[], Any]) -> float:
    """The highest total of the bytes torch's CPU allocator had handed out during the call, above
    what it held when the call began, in MB (:func:`allocated_peak_of_call` less what was
    allocated before: the weights and whatever else the process holds)."""
    events = _memory_events(run)
    if not events:
        return 0.0
    before = events[0]["Total Allocated"] - events[0]["Bytes"]
    return (max(event["Total Allocated"] for event in events) - before) / 2**20


def resident_peak_of_call(run: Callable[[], Any]) -> float:
    """The highest resident size of the process during the call, above its resident size right
    before it, in MB (Linux only: writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's
    resident peak, ``VmHWM`` in ``/proc/self/status``, to the current resident size).

    For the large sizes, where :func:`allocated_peak_of_call` cannot be used: the profiler it
    reads keeps an event per allocation, which at a billion parameters and hundreds of tokens
    takes more memory than the call. No trace is kept here, and nothing slows the call, so time
    and memory can come from one call. Exact to a few tens of MB (a page granularity, and what
    glibc keeps of freed small blocks; large blocks are mapped and unmapped, so they follow the
    allocator), which is noise at GB scale; it counts what torch's allocator does not see
    (oneDNN's scratch buffers, Python objects). Freed heap memory is returned to the system
    first (:func:`release_freed_memory`), so that the size before the call is what is in use;
    the weights must be resident before the call (read into memory, not mapped from a file and
    paged in during it)."""
    release_freed_memory()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_kb("VmRSS")
    output = run()
    peak = _status_kb("VmHWM")
    del output
    return (peak - before) / 1024


def _status_kb(field_name: str) -> int:
    """A field of ``/proc/self/status`` given in kB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def _memory_events(run: Callable[[], Any]) -> list[dict[str, Any]]:
    """The CPU allocator's events of a call, as the profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    release_freed_memory()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        output = run()
    del output
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    return [event["args"] for event in events
            if event.get("name") == "[memory]" and event["args"].get("Device Type", 0) == 0]
