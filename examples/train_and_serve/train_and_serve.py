"""Train a small DLRM on synthetic click logs, export it both ways into a model repository, serve it, query it.

The click logs follow a known ground-truth rule (a user x item affinity, a category bias, two dense features and
a history effect, through a sigmoid), so the AUC means something: the rule's own click probabilities give the
best AUC any model can reach on these labels, printed next to the trained model's.

    python examples/train_and_serve/train_and_serve.py --out out/train_and_serve

writes ``out/train_and_serve/repo/`` (``ctr/1/model.safetensors`` + ``spec.yaml``, ``ctr_pt2/1/model.pt2``,
``ctr_ts/1/model.pt``), serves it (the same node as ``recserve serve --repository out/train_and_serve/repo``)
and checks with tritonclient, over HTTP and gRPC, that the served scores are the trained model's.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

from recserve.serving.wire.codec import triton_inputs
from recserve.specs import ModelSpec, model_from_dict
from recserve.zoo import FAMILY_CLASSES, RecModel
from recserve.zoo.artifacts import write_version
from recserve.zoo.batch import QueryBatch

USERS, ITEMS, CATEGORIES, HISTORY = 2000, 2000, 50, 3
DENSE = 8
SPEC = dict(family="dlrm", dense_in=DENSE, bottom_mlp=[32, 8], top_mlp=[64, 32, 1], interaction="dot",
            sla=dict(target_ms=20, percentile=95),
            tables=[dict(name="user", rows=USERS, dim=8, side="user"),
                    dict(name="item", rows=ITEMS, dim=8),
                    dict(name="category", rows=CATEGORIES, dim=8),
                    dict(name="history", rows=ITEMS, dim=8, pooling=HISTORY, side="user")])
ARTIFACTS = {"ctr": "safetensors", "ctr_pt2": "export", "ctr_ts": "torchscript"}


@dataclass
class ClickLog:
    dense: np.ndarray  # [n, DENSE] float32
    ids: np.ndarray  # [n, 3 + HISTORY] int64: user, item, category, history items
    clicks: np.ndarray  # [n] float32 (0/1)
    truth: np.ndarray  # [n] the rule's click probability

    def batch(self, rows: slice | np.ndarray) -> QueryBatch:
        """The wire format: table-major values, lengths [tables, batch]."""
        ids = self.ids[rows]
        n = ids.shape[0]
        values = np.concatenate([ids[:, 0], ids[:, 1], ids[:, 2], ids[:, 3:].reshape(-1)])
        lengths = np.array([[1] * n, [1] * n, [1] * n, [HISTORY] * n], dtype=np.int32)
        return QueryBatch(torch.from_numpy(self.dense[rows]), torch.from_numpy(values), torch.from_numpy(lengths))


def click_logs(n: int, seed: int) -> ClickLog:
    """Synthetic impressions whose click probability follows one fixed rule (the same rule for every seed)."""
    world = np.random.default_rng(1234)  # the rule: latent tastes and biases
    user_taste, item_taste = world.standard_normal((USERS, 4)), world.standard_normal((ITEMS, 4))
    item_category = world.integers(0, CATEGORIES, ITEMS)
    category_bias = world.normal(0, 1.0, CATEGORIES)
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    history = rng.integers(0, ITEMS, (n, HISTORY))
    dense = rng.standard_normal((n, DENSE)).astype(np.float32)
    affinity = (user_taste[user] * item_taste[item]).sum(1)
    history_match = (item_taste[history] * item_taste[item][:, None, :]).sum(2).mean(1)
    logit = 0.9 * affinity + category_bias[item_category[item]] + 0.8 * dense[:, 0] - 0.6 * dense[:, 1] * dense[:, 2] \
        + 0.5 * history_match - 1.0
    truth = 1 / (1 + np.exp(-logit))
    clicks = (rng.random(n) < truth).astype(np.float32)
    ids = np.column_stack([user, item, item_category[item], history]).astype(np.int64)
    return ClickLog(dense, ids, clicks, truth)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U from ranks; ties share their rank)."""
    ranks = rankdata(scores)
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train(log: ClickLog, spec: ModelSpec, epochs: int, batch_size: int = 512, seed: int = 0,
          lr: float = 3e-3) -> RecModel:
    torch.manual_seed(seed)
    model = FAMILY_CLASSES[spec.family](spec, tuple(t.rows for t in spec.tables))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = torch.nn.BCELoss()
    order = np.random.default_rng(seed)
    for epoch in range(epochs):
        model.train()
        perm = order.permutation(len(log.clicks))
        total = 0.0
        for start in range(0, len(perm), batch_size):
            rows = perm[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(log.batch(rows))[:, 0], torch.from_numpy(log.clicks[rows]))
            loss.backward()
            optimizer.step()
            total += loss.item() * len(rows)
        print(f"epoch {epoch + 1}/{epochs}: train log-loss {total / len(perm):.4f}", flush=True)
    return model.eval()


def predict(model: RecModel, log: ClickLog, batch_size: int = 1024) -> np.ndarray:
    with torch.inference_mode():
        return np.concatenate([model(log.batch(slice(s, s + batch_size)))[:, 0].numpy()
                               for s in range(0, len(log.clicks), batch_size)])


def export(model: RecModel, repo: Path) -> None:
    """One repository model per artifact kind, each with its serving settings in config.yaml."""
    for name, kind in ARTIFACTS.items():
        (repo / name).mkdir(parents=True, exist_ok=True)
        (repo / name / "config.yaml").write_text(
            "workers: 1\nthreads: 1\nmax_query_size: 1024\nqueue_limit: 64\nsla: {target_ms: 20, percentile: 95}\n"
            "version_policy: {latest: {num_versions: 1}}\n")
        path = write_version(model, repo / name, 1, kind)
        print(f"exported {kind:<11} -> {path} ({path.stat().st_size / 1e3:,.0f} kB)", flush=True)


def query_served(http_port: int, grpc_port: int, log: ClickLog, expected: np.ndarray,
                 batch_size: int = 256) -> dict[str, dict[str, float]]:
    """Score the test log through every served model over HTTP and gRPC (tritonclient); diff and AUC."""
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    clients = {"http": (thttp, thttp.InferenceServerClient(f"127.0.0.1:{http_port}")),
               "grpc": (tgrpc, tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}"))}
    results = {}
    for name in ARTIFACTS:
        for protocol, (module, client) in clients.items():
            batches = (log.batch(slice(s, s + batch_size)).as_arrays() for s in range(0, len(log.clicks), batch_size))
            served = np.concatenate([client.infer(name, triton_inputs(module, arrays)).as_numpy("scores")[:, 0]
                                     for arrays in batches])
            results[f"{name} {protocol}"] = {"max_abs_diff": float(np.abs(served - expected).max()),
                                             "auc": auc(log.clicks, served)}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/train_and_serve", help="the repository goes to OUT/repo")
    parser.add_argument("--samples", type=int, default=1_000_000, help="training impressions")
    parser.add_argument("--test-samples", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    spec = model_from_dict("ctr", SPEC)
    train_log, test_log = click_logs(args.samples, seed=1), click_logs(args.test_samples, seed=2)
    print(f"click logs: {args.samples:,} training / {args.test_samples:,} test impressions, "
          f"CTR {train_log.clicks.mean():.3f}", flush=True)
    model = train(train_log, spec, args.epochs)
    in_process = predict(model, test_log)
    summary = {"auc_model": auc(test_log.clicks, in_process), "auc_ground_truth": auc(test_log.clicks, test_log.truth)}
    print(f"test AUC: trained DLRM {summary['auc_model']:.4f}  (the ground-truth rule itself: "
          f"{summary['auc_ground_truth']:.4f}; random: 0.5)", flush=True)
    repo = Path(args.out) / "repo"
    export(model, repo)

    from recserve.serving import NodeServer
    from recserve.serving.node.config import NodeConfig

    server = NodeServer(NodeConfig(models=[], repository=str(repo)))
    ports = server.start()
    print(f"serving {repo} (as `recserve serve --repository {repo}`) on http://127.0.0.1:{ports.http}, "
          f"grpc 127.0.0.1:{ports.grpc}", flush=True)
    try:
        summary["served"] = query_served(ports.http, ports.grpc, test_log, in_process)
    finally:
        server.stop()
    for key, r in summary["served"].items():
        print(f"served {key:<13} max |served - in-process| = {r['max_abs_diff']:.2g}   AUC {r['auc']:.4f}")
    summary["seconds"] = time.perf_counter() - started
    print(f"done in {summary['seconds']:.0f} s", flush=True)
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
