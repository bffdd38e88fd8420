"""Pure-torch models for the TorchLens test zoo (imports torch only).

Every ``build`` is deterministic: it runs inside :func:`seeded`, which forks the global RNG,
seeds it, and restores it afterwards, so building a case never disturbs the caller's RNG.
Models come back in eval mode unless the case name ends in ``_train``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["PURE_CASES", "ZooCase", "call_model", "seeded"]


@dataclass(frozen=True)
class ZooCase:
    """One model of the zoo.

    ``build()`` returns ``(model, example_input)``; feed the input with :func:`call_model`.
    ``needs`` names the optional packages the case imports (``"torchvision"``,
    ``"transformers"``). ``module_outputs`` names submodule addresses (as in
    ``model.named_modules()``) whose output is one tensor produced directly by a single torch
    op (never an in-place one) and never mutated in place later in the forward, so the op's
    saved activation must equal the module output a forward hook sees. A module listed there may
    run more than once per forward (``cell`` in
    ``recurrent``); then every call's output is such a tensor.
    """

    name: str
    build: Callable[[], tuple[nn.Module, object]]
    needs: frozenset[str] = frozenset()
    module_outputs: tuple[str, ...] = ()


def call_model(model: Callable[..., object], x: object) -> object:
    """Call ``model`` with ``x`` the way TorchLens does.

    A tensor is passed as the single positional argument, a tuple or list is unpacked as
    positional arguments, and a mapping is unpacked as keyword arguments. Anything else is
    passed as the single positional argument.
    """
    if isinstance(x, torch.Tensor):
        return model(x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    if isinstance(x, Mapping):
        return model(**x)
    return model(x)


@contextlib.contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Seed torch's global RNG for the block, restoring the previous CPU RNG state after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------------------------
# 1. mlp


class BuildsInForward(nn.Module):
    """Builds a lazy submodule in its first forward (not a zoo case: a capture discloses it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        if not hasattr(self, "lazy"):
            self.lazy = nn.LazyLinear(4)
        return self.lazy(self.fc(x))


def build_mlp() -> tuple[nn.Module, object]:
    with seeded(1):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        x = torch.randn(2, 8)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 2. cnn_bn


class CnnBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn(self.conv(x))))
        x = torch.flatten(x, 1)
        return self.fc(x)


def _randomize_bn_stats(model: nn.Module) -> None:
    """Give BatchNorm layers non-trivial running stats so eval-mode BN is not an identity."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
            m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)


def build_cnn_bn() -> tuple[nn.Module, object]:
    with seeded(2):
        model = CnnBn()
        _randomize_bn_stats(model)
        x = torch.randn(1, 3, 16, 16)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 3. residual


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = x.mean(dim=(2, 3))
        return self.fc(x)


def build_residual() -> tuple[nn.Module, object]:
    with seeded(3):
        model = Residual()
        _randomize_bn_stats(model)
        x = torch.randn(1, 3, 8, 8)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
class RootLoop(nn.Module):
    """A recurrent loop written at the root (a reservoir): ``h = tanh(h @ W + x[:, t] @ U)``,
    ``steps`` × 5 ops and no submodule at all; the drawing tests and benchmark use it."""

    def __init__(self, steps: int = 150):
        super().__init__()
        self.steps = steps
        self.w = nn.Parameter(torch.randn(16, 16) * 0.1)
        self.u = nn.Parameter(torch.randn(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 16)
        for t in range(self.steps):
            h = torch.tanh(h @ self.w + x[:, t] @ self.u)
        return h.sum(-1)


# 4. recurrent


class Recurrent(nn.Module):
    """The same ``cell`` submodule runs three times in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.cell = nn.Linear(8, 8)
        self.readout = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for _ in range(3):
            h = torch.tanh(self.cell(h))
        return self.readout(h)


def build_recurrent() -> tuple[nn.Module, object]:
    with seeded(4):
        model = Recurrent()
        x = torch.randn(2, 4)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 5. branch_concat


class BranchConcat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branch_a = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
        self.branch_b = nn.Sequential(nn.Linear(6, 4), nn.Sigmoid())
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch_a(x)
        b = self.branch_b(x)
        return self.head(torch.cat([a, b], dim=1))


def build_branch_concat() -> tuple[nn.Module, object]:
    with seeded(5):
        model = BranchConcat()
        x = torch.randn(2, 6)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 6. inplace


class Inplace(nn.Module):
    """In-place ops on intermediates only (the input tensor itself is never mutated)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.fc2 = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        y.relu_()  # Tensor in-place method
        z = self.act(self.fc2(x))  # nn.ReLU(inplace=True)
        z += y  # augmented assignment -> add_
        v = z.view(-1)
        v.mul_(2)  # in-place through a view: mutates z's storage
        return z * 1


def build_inplace() -> tuple[nn.Module, object]:
    with seeded(6):
        model = Inplace()
        x = torch.randn(2, 6)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 7. views_indexing


class ViewsIndexing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (2, 4, 6)
        x = self.fc(x)
        flat = x.reshape(2, 24)
        x = flat.view(2, 4, 6)
        t = x.transpose(1, 2)  # (2, 6, 4)
        p = t.permute(2, 0, 1)  # (4, 2, 6)
        s = p[:, 1:3]  # (4, 1, 6)
        first = x[0]  # (4, 6), integer indexing
        m = first.T.unsqueeze(0)  # (1, 6, 4)
        c1, c2 = torch.chunk(s, 2, dim=0)  # (2, 1, 6) each
        parts = torch.split(first, [1, 3], dim=0)  # (1, 6), (3, 6)
        out = c1.squeeze(1) + c2.squeeze(1)  # (2, 6)
        out = out + parts[0] + parts[1].sum(0)  # (2, 6)
        return out + m.sum(-1)  # (2, 6)


def build_views_indexing() -> tuple[nn.Module, object]:
    with seeded(7):
        model = ViewsIndexing()
        x = torch.randn(2, 4, 6)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 8. multi_positional


class MultiPositional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fa = nn.Linear(4, 5)
        self.fb = nn.Linear(3, 5)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fa(a) * torch.sigmoid(self.fb(b))


def build_multi_positional() -> tuple[nn.Module, object]:
    with seeded(8):
        model = MultiPositional()
        a = torch.randn(2, 4)
        b = torch.randn(2, 3)
    return model.eval(), (a, b)


# --------------------------------------------------------------------------------------------
# 9. keyword_inputs


class KeywordInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(
        self,
        x: torch.Tensor,
        *,
        scale: float | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        y = self.fc(x)
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        if scale is not None:
            y = y * scale
        return y


def build_keyword_inputs() -> tuple[nn.Module, object]:
    with seeded(9):
        model = KeywordInputs()
        x = torch.randn(2, 6)
        mask = torch.rand(2, 6) > 0.3
    return model.eval(), {"x": x, "mask": mask}


# --------------------------------------------------------------------------------------------
# 10. tuple_output


class TupleOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(5, 8)
        self.head_a = nn.Linear(8, 3)
        self.head_b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.gelu(self.body(x))
        return self.head_a(h), self.head_b(h)


def build_tuple_output() -> tuple[nn.Module, object]:
    with seeded(10):
        model = TupleOutput()
        x = torch.randn(2, 5)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 11. dict_output


class DictOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(5, 8)
        self.classifier = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        features = torch.relu(self.backbone(x))
        logits = self.classifier(features)
        return {
            "logits": logits,
            "features": features,
            "aux": (logits.softmax(-1), features.mean(-1)),
        }


def build_dict_output() -> tuple[nn.Module, object]:
    with seeded(11):
        model = DictOutput()
        x = torch.randn(2, 5)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 12. transformer_encoder


def build_transformer_encoder() -> tuple[nn.Module, object]:
    with seeded(12):
        layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, batch_first=True
        )
        model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        x = torch.randn(2, 5, 16)
    return model.eval(), x


# --------------------------------------------------------------------------------------------
# 13. tied_params


class TiedParams(nn.Module):
    """Embedding and LM head share one weight Parameter (count it once)."""

    def __init__(self, vocab: int = 20, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(self.emb(ids)))
        return self.head(h)


def build_tied_params() -> tuple[nn.Module, object]:
    with seeded(13):
        model = TiedParams()
        ids = torch.randint(0, 20, (2, 5))
    return model.eval(), ids


# --------------------------------------------------------------------------------------------
# 14. dropout_train


class DropoutTrain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(p=0.5)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


def build_dropout_train() -> tuple[nn.Module, object]:
    """TRAIN mode: dropout is random (seed before each call) and BN updates running stats."""
    with seeded(14):
        model = DropoutTrain()
        x = torch.randn(4, 8)
    return model.train(), x


# --------------------------------------------------------------------------------------------
# 15. lstm


class LstmHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=6, hidden_size=8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def build_lstm() -> tuple[nn.Module, object]:
    with seeded(15):
        model = LstmHead()
        x = torch.randn(2, 5, 6)
    return model.eval(), x


# --------------------------------------------------------------------------------------------

PURE_CASES: dict[str, ZooCase] = {
    c.name: c
    for c in [
        ZooCase("mlp", build_mlp, module_outputs=("0", "1", "2")),
        ZooCase("cnn_bn", build_cnn_bn, module_outputs=("conv", "bn", "relu", "pool", "fc")),
        ZooCase(
            "residual",
            build_residual,
            module_outputs=("stem", "blocks.0", "blocks.0.conv1", "blocks.1.bn2", "fc"),
        ),
        ZooCase("recurrent", build_recurrent, module_outputs=("inp", "cell", "readout")),
        ZooCase(
            "branch_concat",
            build_branch_concat,
            module_outputs=("branch_a", "branch_a.0", "branch_b.1", "head"),
        ),
        # fc1's and fc2's outputs are later mutated in place (relu_, ReLU(inplace=True), +=),
        # so a hook's reference no longer holds the op's value: none are listed.
        ZooCase("inplace", build_inplace),
        ZooCase("views_indexing", build_views_indexing, module_outputs=("fc",)),
        ZooCase("multi_positional", build_multi_positional, module_outputs=("fa", "fb")),
        ZooCase("keyword_inputs", build_keyword_inputs, module_outputs=("fc",)),
        ZooCase("tuple_output", build_tuple_output, module_outputs=("body", "head_a", "head_b")),
        ZooCase("dict_output", build_dict_output, module_outputs=("backbone", "classifier")),
        # In eval mode under torch.no_grad, with no module hooks and no torch-function mode
        # active, each layer runs the fused aten::_transformer_encoder_layer_fwd and its
        # submodules (linear1, ...) never run; a hook or a mode turns that fast path off.
        # Which ops run thus depends on how it is observed, so no module_outputs are listed.
        ZooCase("transformer_encoder", build_transformer_encoder),
        ZooCase("tied_params", build_tied_params, module_outputs=("emb", "proj", "head")),
        ZooCase("dropout_train", build_dropout_train, module_outputs=("fc1", "bn", "fc2")),
        ZooCase("lstm", build_lstm, module_outputs=("head",)),
    ]
}
