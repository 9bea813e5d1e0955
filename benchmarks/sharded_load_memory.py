"""Host memory of an FSDP2 load at world 2 (CPU, gloo): the sharded load from safetensors against the
rank-0 build and broadcast (issue 35, point 5).

    python benchmarks/sharded_load_memory.py [--hidden 1024] [--layers 8] [--directory /tmp/sharded-load-model]

Writes a float32 qwen2 (about 200M parameters by default) with ``save_pretrained``, then on two processes
runs ``rlhfctl.engine.placement.materialize`` both ways and reports each rank's peak rise in resident memory during
the call (sampled every 2 ms), anonymous (``RssAnon``: copies the process made) and file-backed (``RssFile``:
pages of the mapped safetensors files, page cache shared between the ranks of a node and reclaimable).
``from_pretrained`` on rank 0 reads its whole model through such a map.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import rlhfctl.engine.placement as engine  # noqa: E402
from rlhfctl.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfctl.single_controller.worker import free_port  # noqa: E402


def resident_mib() -> tuple[float, float]:
    """This process's resident memory, (anonymous, file-backed), in MiB (Linux ``/proc/self/status``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        fields = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status if line.startswith("Rss")}
    return fields["RssAnon"], fields["RssFile"]


def rank_main(rank: int, directory: str, mode: str, port: int, results: dict) -> None:
    """One rank: materialize the model ``mode``'s way and record the peak rises of resident memory."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tokenizer = load_tokenizer({"path": directory})
    if mode == "broadcast":
        engine.checkpoint_directory = lambda model_cfg: None  # as an inline config (or a .bin checkpoint) loads
    settings = engine.EngineSettings("fsdp2", torch.float32, trainable=True)
    before, samples, done = resident_mib(), [], threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(resident_mib())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    module, _ = engine.materialize(lambda cfg: load_causal_lm(cfg, tokenizer, dtype=torch.float32, seed=0),
                                   {"path": directory, "trust_remote_code": False}, settings, torch.device("cpu"))
    done.set()
    sampler.join()
    results[(mode, rank)] = tuple(max(sample[kind] for sample in samples) - before[kind] for kind in (0, 1))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--directory", default="/tmp/sharded-load-model")
    args = parser.parse_args()
    config = {"model_type": "qwen2", "hidden_size": args.hidden, "num_hidden_layers": args.layers,
              "num_attention_heads": 8, "intermediate_size": 4 * args.hidden, "vocab_size": 32000}
    tokenizer = load_tokenizer({"config": config})
    model = load_causal_lm({"config": config}, tokenizer, dtype=torch.float32, seed=0)
    whole = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    model.save_pretrained(args.directory)
    tokenizer.save_pretrained(args.directory)
    del model
    results = mp.Manager().dict()
    for mode in ("sharded", "broadcast"):
        mp.spawn(rank_main, args=(args.directory, mode, free_port(), results), nprocs=2)
    print(f"model: {whole:.0f} MiB in float32; resident memory each rank gained while loading (anonymous + file pages):")
    for mode in ("sharded", "broadcast"):
        ranks = "   ".join(f"rank {rank} {results[(mode, rank)][0]:5.0f} + {results[(mode, rank)][1]:5.0f} MiB" for rank in (0, 1))
        print(f"  {mode:9s}  {ranks}")


if __name__ == "__main__":
    main()
