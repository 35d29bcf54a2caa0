"""DDP training on simdev, one process per device, for
`torchrun --nproc-per-node 2 ddp_train.py OUT [--visible-per-rank]`
(test_distributed_ddp.py runs it): a small MLP, a fixed global batch split
between the ranks, SGD; rank 0 saves the trained parameters to OUT.
--visible-per-rank: each process sees only its own device
(SIMDEV_VISIBLE_DEVICES=<local rank>, set before torch loads the backend),
as simdev:0. Also importable: train(device, batches, world, rank) is the
loop test_distributed_ddp.py runs on one CPU process as the reference."""
import os
import sys

if "--visible-per-rank" in sys.argv:
    os.environ["SIMDEV_VISIBLE_DEVICES"] = os.environ.get("LOCAL_RANK", "0")

import torch  # noqa: E402

STEPS, BATCH, IN, HIDDEN, OUT = 5, 16, 8, 32, 4


def data():
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g))
            for _ in range(STEPS)]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, OUT))


def train(net, device, world=1, rank=0):
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    per = BATCH // world
    for x, y in data():
        x = x[rank * per:(rank + 1) * per].to(device)
        y = y[rank * per:(rank + 1) * per].to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
    return net


def main():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_simdev  # noqa: F401  (also autoloaded by import torch)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    index = local % torch.simdev.device_count()
    torch.simdev.set_device(index)
    device = torch.device("simdev", index)
    dist.init_process_group("cpu:gloo,simdev:simdev")
    net = DDP(model().to(device), device_ids=None)
    train(net, device, world, rank)
    if rank == 0:
        torch.save({k: v.cpu() for k, v in net.module.state_dict().items()}
                   | {"_devices": torch.simdev.device_count()}, sys.argv[1])
    # Every rank past its last collective before the group goes: a rank
    # that finalizes while a gloo thread still runs Python aborts with
    # "terminate called without an active exception"
    # (Note [Completion on a thread of the group's own]).
    dist.barrier()
    torch.simdev.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
