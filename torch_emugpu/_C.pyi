"""Type stub of torch_emugpu._C, the compiled extension (csrc/backend/bindings).

Private: the package's Python modules are its only callers. Device indices
are emugpu device indices; times in nanoseconds are the host's steady clock
(the timeline's clock) unless the name says seconds.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

DEFAULT_GPU: str

# --- device: configuration, devices, synchronize, statistics (device.cpp) ---

def _configure(
    gpu: str | None,
    count: int | None,
    mode: str | None,
    clock: str | None = None,
    host: str | None = None,
    host_speed: float | None = None,
) -> None:
    """Configures the emulated devices; arguments left as None come from the environment."""

def _clock_kind() -> str:
    """ "real" or "virtual": the clock the devices run on."""

def _clock_read_ns() -> int:
    """The process's time as a script reads it: virtual (charging the host work since the last read) or steady."""

def _clock_sleep_ns(ns: int) -> None:
    """Advances the virtual clock by `ns` (time.sleep); RuntimeError under the real clock."""

def _clock_receive_ns(ns: int) -> None:
    """Moves the virtual clock to at least `ns` (a message stamped then arrived); nothing under the real clock."""

def _clock_charge_blocked_ns(ns: int) -> None:
    """Measured host: adds `ns` of the thread's blocked time (storage waits) as host work; nothing otherwise."""

def _clock_stats() -> dict[str, Any]:
    """The clock's kind and, under the virtual clock, its speedup and where its time went."""

def _clock_reset_stats() -> None:
    """Restarts _clock_stats()'s figures."""

def _ensure_configured() -> None:
    """Configures from the environment unless already configured."""

def _configured() -> bool:
    """Whether the devices are configured."""

def _config() -> dict[str, Any]:
    """The configuration: gpu, device_count, mode, catalog, exchange, host_copy_gbps, host_op_us."""

def _set_mode(mode: str) -> None:
    """Switches between 'timing' (shapes only) and 'compute' (real values too)."""

def _mode() -> str:
    """'timing' or 'compute'."""

def _device_count() -> int:
    """Number of emulated devices."""

def _current_device() -> int:
    """This thread's current emugpu device."""

def _set_device(index: int) -> None:
    """Makes `index` this thread's current device."""

def _gpu_names() -> list[str]:
    """Names of every GPU in the catalog."""

def _device_properties(index: int) -> dict[str, Any]:
    """The emulated device's GPU spec (name, total_memory, multi_processor_count, peak rates, ...)."""

def _gpu_properties(name: str) -> dict[str, Any]:
    """Any catalog GPU's spec, matched loosely as EMUGPU_GPU is."""

def _synchronize(index: int) -> None:
    """Blocks the host until the device finished everything launched (deferred collectives included)."""

def _default_generator(index: int) -> torch.Generator:
    """The device's default random generator."""

def _in_bad_fork() -> bool:
    """Whether this is a forked child of a process that used the devices."""

def _shape_cache_stats() -> tuple[int, int]:
    """(hits, misses) of the ops' shape cache."""

def _shape_cache_entries() -> int:
    """Entries the process's shape cache holds now (at most 100,000)."""

def _host_now_ns() -> int:
    """The host clock the timeline runs on."""

def _device_ready_ns(index: int) -> int:
    """When the device finishes what was launched so far."""

def _engine_stats(index: int) -> dict[str, Any]:
    """Per engine (compute, h2d, d2h, collective): (launches, busy ns); and host_blocked_ns."""

def _host_bound_stats(index: int) -> dict[str, Any]:
    """Host-bound windows: windows, host_bound_windows, last/worst idle fraction, idle_ns."""

def _reset_engine_stats(index: int) -> None:
    """Zeroes the engine and host-bound statistics."""

def _utilization(index: int) -> float:
    """Fraction of recent time the compute engine was busy."""

def _emulate_kernel(index: int, seconds: float) -> int:
    """Charges a kernel of `seconds` on the current stream; returns its end."""

# --- memory: allocators and shared storages (memory.cpp) ---

def _memory_stats(index: int) -> dict[str, Any]:
    """torch.cuda.memory_stats()'s counters of the emulated caching allocator."""

def _reset_peak_memory_stats(index: int) -> None:
    """Resets the peaks."""

def _reset_accumulated_memory_stats(index: int) -> None:
    """Resets the accumulated counts."""

def _host_memory_stats() -> dict[str, Any]:
    """The pinned host allocator's counters."""

def _host_reset_peak_stats() -> None:
    """Resets the pinned allocator's peaks."""

def _host_reset_accumulated_stats() -> None:
    """Resets the pinned allocator's accumulated counts."""

def _empty_cache() -> None:
    """Releases the caching allocator's unused segments."""

def _mem_get_info(index: int) -> tuple[int, int]:
    """(free, total) bytes of the emulated GPU."""

def _share_storage(storage: Any) -> tuple[int, int, int, int, int, int, bool, int]:
    """For another process: (fd, map offset, map length, data offset, bytes, device, materialized, ready ns)."""

def _open_shared_storage(
    fd: int,
    map_offset: int,
    map_length: int,
    data_offset: int,
    nbytes: int,
    device: int,
    materialized: bool,
    ready_ns: int,
) -> Any:
    """The storage another process shared."""

def _refresh_shared_storage(storage: Any, materialized: bool, ready_ns: int) -> None:
    """Updates a received storage's real-bytes flag and ready time."""

def _deferred_copy_stats() -> dict[str, int]:
    """Copies of real bytes between emugpu tensors: recorded, done (bytes needed), dropped (never needed), pending."""

def _reset_deferred_copy_stats() -> None:
    """Zeroes the recorded, done and dropped counts (pending stays)."""

# --- regions: profiles and profiled regions (regions.cpp) ---

def _forward_begin(index: int, key: str, target_s: float, called_at_ns: int) -> bool:
    """A profiled root module's forward begins (target < 0: a cost-model region)."""

def _forward_end(index: int, backward_key: str, backward_s: float, expects_backward: bool) -> None:
    """The forward region ends; its backward + update region opens if autograd will run."""

def _backward_reached(index: int, backward_key: str, backward_s: float) -> None:
    """Autograd reached the profiled model."""

def _region_abort(index: int) -> None:
    """Closes the open region (an exception inside it)."""

def _region_report(index: int) -> list[dict[str, Any]]:
    """Per region: key, kind, target, last, charged, estimated, padded, waited, occurrences, host_bound, ..."""

def _region_curve_target(index: int, key: str, batch: int, points: list[tuple[int, float]]) -> dict[str, Any] | None:
    """Region `key`'s target at `batch` along the cost model's curve through `points`, or None before an occurrence."""

def _set_measured_transfer(index: int, latency_s: float, rate: float, pinned_rate: float) -> None:
    """Host-device copies from a profile's measured transfer rates."""

def _reload_profiles() -> list[dict[str, Any]]:
    """Reads the profiles and the GPU's calibration again from the search path; returns the profiles' summaries."""

def _profile_summaries() -> list[dict[str, Any]]:
    """Summaries of the profiles read at the last configuration or reload."""

def _profiles_generation() -> int:
    """How often profiles were read; changes at every configuration and reload."""

def _search_path() -> dict[str, list[str]]:
    """The directories searched now: {"profiles": [...], "calibration": [...]}, first match wins."""

def _scan_profiles(directories: list[str]) -> list[dict[str, Any]]:
    """Summaries of the profiles in `directories`, read without being used."""

def _profile_lookup(
    gpu: str, model: str, parameters: int | None, batch_size: int, gpu_count: int
) -> dict[str, Any] | None:
    """The profile entry for (GPU, model) at `batch_size`, interpolated, or None; `points` are its table's
    measured (batch_size, forward_s, backward_s)."""

# --- cost: cost models and calibration (cost.cpp) ---

def _current_kernel_params(index: int) -> dict[str, Any]:
    """The device's kernel parameters and their source."""

def _cost_report(index: int) -> list[dict[str, Any]]:
    """What the cost model charged, per op family."""

def _reset_cost_report(index: int) -> None:
    """Zeroes the cost report."""

def _cost_trace_start(index: int, limit: int) -> None:
    """Records the next `limit` ops the cost model times."""

def _cost_trace(index: int) -> list[dict[str, Any]]:
    """The recorded ops, as the cost model saw them, with the rule that timed each (rule_family, rule)."""

def _kernel_times(gpu: str, params: dict[str, float], ops: list[dict[str, Any]]) -> list[int]:
    """Each op's duration on a catalog GPU with its row's parameters, `params` over them."""

def _fit_kernel_params(gpu: str, start: dict[str, float], cases: list[Any], names: list[str]) -> dict[str, Any]:
    """Kernel parameters fitted to measured (ops, seconds) cases."""

def _kernel_params(gpu: str) -> dict[str, Any]:
    """A catalog GPU's architecture row of kernel parameters."""

def _collective_time(
    kind: str,
    bytes: float,
    gpu: str,
    ranks_per_node: int,
    nodes: int,
    net_gbps: float | None = None,
    net_latency_us: float | None = None,
    algorithms: str | None = None,
) -> dict[str, Any]:
    """The collective cost model: seconds, algorithm, protocol, bus factor."""

# --- distributed: backend `emu` (distributed.cpp) ---

class _EmuProcessGroup(_C10dBackend):
    """Backend `emu` of one process group (csrc/backend/distributed/process_group.h)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float) -> None: ...
    @property
    def payload_bytes_moved(self) -> int:
        """Bytes of this rank's tensors that collectives carried."""
    @property
    def transport(self) -> str:
        """'shm' or 'tcp': the transport of the per-collective words."""
    @property
    def ranks_per_node(self) -> int:
        """Ranks per node in the collective cost model's topology."""
    @property
    def nodes(self) -> int:
        """Nodes in the collective cost model's topology."""
    @property
    def clock_offset_ns(self) -> int:
        """This rank's steady clock minus rank 0's."""
    def calls(self) -> dict[str, int]:
        """How often c10d handed this group each collective, by method name."""
    def drain(self) -> None:
        """Waits until every collective launched so far is placed on the timeline."""
    def gather_words(self, count: int) -> None:
        """An all-gather of `count` zero words and nothing else (the benchmarks' baseline)."""
    def perform_nocolor_split(self, device: Any) -> None:
        """Ranks outside a new group take no part in its set-up."""

def _drain_all_groups() -> None:
    """Places every deferred collective of this process."""

def _group_topology(nodes: list[int], size: int) -> tuple[int, int]:
    """(ranks per node, nodes) from every rank's node key (-1: unknown)."""

def _fresh_namespace(store: dist.Store, rank: int, size: int, timeout_s: float) -> str:
    """A store key prefix no earlier instance of this group used, the same on every rank."""

def _listen_address(store: dist.Store) -> str:
    """The address the TCP transport listens on: the one facing the group's TCPStore."""

def _address_towards(host: str) -> str:
    """The local address from which this machine reaches `host` ('' if it cannot tell)."""

def _collective_duration(index: int, kind: str, bytes: float, world: int, ranks_per_node: int) -> int:
    """Modelled duration (ns) of a collective on this device's GPU and the configured network."""

def _host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over an emugpu tensor's bytes, charged nothing."""

def _is_materialized(t: torch.Tensor) -> bool:
    """Whether the tensor's storage holds real bytes."""

def _set_materialized(t: torch.Tensor, value: bool) -> None:
    """Marks the tensor's storage as holding real bytes (or placeholders)."""

def _daemon_default_address() -> str:
    """emugpud's default socket: unix:$XDG_RUNTIME_DIR/emugpud.sock, else unix:/tmp/emugpud-UID.sock."""

def _daemon_gpu(index: int) -> int:
    """The emugpud GPU (an index of its status) that emulated device `index` is; -1 without a daemon."""

def _daemon_status(address: str) -> dict[str, Any]:
    """The daemon's GPUs (index, name, capacity, total, used) and attached processes; RuntimeError if none answers."""

def _daemon_attachment() -> dict[str, Any] | None:
    """This process's attachment to emugpud (address, client, gpus), or None."""
