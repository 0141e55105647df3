"""A training script written for CUDA, in the shapes third-party scripts use;
test_run_mode.py runs it unmodified under `torch-emugpu run` and reads the
JSON it prints last (what each form produced)."""

import io
import json
import pickle

import torch
import torch.nn as nn
import torch.nn.functional as F

out: dict = {}
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
out["device_type"] = device.type
out["is_available"] = torch.cuda.is_available()
out["device_count"] = torch.cuda.device_count()
out["bf16"] = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
props = torch.cuda.get_device_properties(0)
out["name"] = torch.cuda.get_device_name(0)
out["props"] = [props.name, props.total_memory, props.multi_processor_count]
out["capability"] = list(torch.cuda.get_device_capability())
accelerator = torch.accelerator.current_accelerator()
out["accelerator"] = [accelerator.type, torch.accelerator.device_count()]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4, pin_memory=True)
out["pinned_batch"] = next(iter(loader))[0].is_pinned()  # torch's own code still sees emugpu as the accelerator
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.manual_seed(0)
torch.cuda.manual_seed(0)
torch.cuda.manual_seed_all(0)

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
out["param_device"] = str(next(model.parameters()).device)
x = torch.randn(32, 64, device=device)
y = torch.randint(0, 10, (32,), device="cuda")
pinned = torch.randn(32, 64).pin_memory()
out["tensor_devices"] = [
    str(t.device)
    for t in (
        x,
        y,
        pinned.to(device, non_blocking=True),
        torch.randn(2).cuda(),
        torch.randn(2).cuda(1),
        torch.zeros(2).to("cuda:1"),
        torch.ones(2, device=torch.device("cuda", 1)),
        torch.arange(4, device="cuda"),
        torch.tensor([1.0], device="cuda"),
        x.new_zeros(3, device="cuda:1"),
        torch.empty_like(x, device="cuda:1"),
        torch.zeros(2).to(device="cuda"),
    )
]
with torch.device("cuda:1"):
    out["device_context"] = str(torch.empty(2).device)
out["module_cuda"] = str(next(nn.Linear(2, 2).cuda().parameters()).device)

opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
scaler = torch.amp.GradScaler("cuda")
legacy_scaler = torch.cuda.amp.GradScaler(enabled=False)
out["scaler_enabled"] = [scaler.is_enabled(), legacy_scaler.is_enabled()]
with torch.autocast("cuda", dtype=torch.bfloat16):
    logits = model(x)
out["autocast_dtype"] = str(logits.dtype)
with torch.amp.autocast(device_type="cuda", dtype=torch.float16):
    logits = model(x)
    loss = F.cross_entropy(logits, y)
out["autocast_fp16_dtype"] = str(logits.dtype)


class Double(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float16)
    def forward(ctx, a):
        return a * 2

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        return grad * 2


with torch.autocast("cuda", dtype=torch.bfloat16):
    out["custom_fwd_dtype"] = str(Double.apply(torch.randn(2, device="cuda")).dtype)  # cast_inputs applies
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
opt.zero_grad(set_to_none=True)

stream = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
with torch.cuda.stream(stream):
    z = model(torch.randn(256, 64, device="cuda"))
torch.cuda.current_stream().wait_stream(stream)
end.record()
torch.cuda.synchronize()
out["elapsed_ms"] = start.elapsed_time(end)

with torch.cuda.device(1):
    out["in_device_context"] = torch.cuda.current_device()
torch.cuda.set_device(1)
out["after_set_device"] = [torch.cuda.current_device(), str(torch.randn(2).cuda().device)]
torch.cuda.set_device(torch.device("cuda", 0))

state = torch.cuda.get_rng_state()
torch.cuda.set_rng_state(state)
out["rng_state_all"] = len(torch.cuda.get_rng_state_all())
gen = torch.Generator(device="cuda")
gen.manual_seed(1)
out["generator"] = [str(gen.device), isinstance(gen, torch.Generator), isinstance(torch.Generator(), torch.Generator)]
out["generator_pickles"] = type(pickle.loads(pickle.dumps(torch.Generator()))).__name__
out["device_pickles"] = str(pickle.loads(pickle.dumps(torch.device("cuda", 1))))

buffer = io.BytesIO()
torch.save({"w": torch.ones(3)}, buffer)
buffer.seek(0)
out["load_map_location"] = str(torch.load(buffer, map_location="cuda")["w"].device)

out["memory_allocated"] = torch.cuda.memory_allocated()
out["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
out["memory_reserved"] = torch.cuda.memory_reserved(0)
out["memory_stats_keys"] = "allocated_bytes.all.peak" in torch.cuda.memory_stats()
big = torch.empty(64 * 2**20, device="cuda")
del z, logits, big
out["reserved_before_empty_cache"] = torch.cuda.memory_reserved(0)
torch.cuda.empty_cache()
out["reserved_after_empty_cache"] = torch.cuda.memory_reserved(0)
torch.cuda.reset_peak_memory_stats()
out["summary"] = "Allocated memory" in torch.cuda.memory_summary()
print(json.dumps(out))
