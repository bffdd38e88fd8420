"""The pinned surfaces' receipt catches each way a forward can change the model: an in-place
write to a parameter, a write through ``.data``, a ``copy_`` into a buffer, a parameter replaced
by a new object (even one of equal content), a training flag; and the tensor fingerprint it
rests on sees one changed element or two swapped ones."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture import policy
from torchlens.capture.policy import state_fingerprints, state_hash

WIDE = 1024  # int64 words a row of the fingerprint's grid
SIZES = {"small": (4,), "large": (600, 1024)}  # 16 bytes; 2.4 MB: 300 rows, 3 CPU blocks


class Net(nn.Module):
    """A parameter, a buffer and a submodule; ``change`` is what its forward does."""

    def __init__(self, change: str, shape: tuple = (4,)):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(shape))
        self.sub = nn.Linear(3, 3)
        self.sub.register_buffer("stat", torch.zeros(3))
        self.change = change

    def forward(self, x):
        if self.change == "inplace":
            with torch.no_grad():
                self.w.view(-1)[7 % self.w.numel()].add_(1.0)
        elif self.change == "data":
            self.w.data.view(-1)[-1] = 5.0
        elif self.change == "data_out":
            torch.mul(self.w.data, 2.0, out=self.w.data)
        elif self.change == "copy_buffer":
            self.sub.stat.copy_(x.detach())
        elif self.change == "replace":
            self.w = nn.Parameter(self.w.detach().clone())
        elif self.change == "train_flag":
            self.sub.training = True
        return self.sub(x) + self.w.sum()


def _fp(t: torch.Tensor) -> str:
    holder = nn.Module()
    holder.register_buffer("t", t)
    return state_fingerprints(holder)["t"]


@pytest.mark.parametrize("size", SIZES)
def test_inplace_parameter_write_fails_naming_it(size):
    model = Net("inplace", SIZES[size])
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, torch.rand(3))
    assert err.value.code == "state_restore_failed"
    assert "['w']" in str(err.value)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("change", ["data", "data_out"])
def test_data_write_fails_naming_it(size, change):
    model = Net(change, SIZES[size])
    version = model.w._version
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, torch.rand(3))
    assert model.w._version == version  # .data writes leave no trace in the version counter
    assert err.value.code == "state_restore_failed"
    assert "['w']" in str(err.value) and "state hash" not in str(err.value)  # the hashes agree
    assert "in-place write the capture saw" in str(err.value)


def test_buffer_copy_is_restored_and_named():
    model = Net("copy_buffer")
    s = tl.summary(model, torch.rand(3) + 1.0)
    assert s.receipt.restored_buffers == ["sub.stat"]
    assert s.receipt.verified and s.receipt.hash_before == s.receipt.hash_after
    assert not s.receipt.changed and not s.receipt.replaced
    assert torch.equal(model.sub.stat, torch.zeros(3))
    assert "buffers written by the forward ['sub.stat']" in str(s).splitlines()[-1]


class Buffers(nn.Module):
    """Buffers of three dtypes, an empty one and a NaN one; ``change`` is what the forward does
    to them: "write" changes one element of a matrix and a zero's sign (equal values, other
    bits), "equal" writes equal values in place, "dtype" gives one new data of another dtype."""

    def __init__(self, change: str = "write"):
        super().__init__()
        for name, value in [("a", torch.arange(3.0)), ("zero", torch.tensor(0.0)),
                            ("count", torch.tensor(5)), ("empty", torch.zeros(0)),
                            ("nan", torch.full((2,), float("nan"))),
                            ("m", torch.ones(2, 2, dtype=torch.float64))]:
            self.register_buffer(name, value)
        self.change = change

    def forward(self, x):
        if self.change == "write":
            self.zero.copy_(torch.tensor(-0.0))
            self.m[1, 0] = 7.0
        elif self.change == "equal":
            self.count.add_(0)
            self.a.mul_(1.0)
        elif self.change == "dtype":
            self.a.data = self.a.data.double()
        return x * self.a.sum()


@pytest.mark.parametrize("one_call", ["one call", "each buffer"])
def test_written_buffers_among_many_are_restored_bit_for_bit(one_call, monkeypatch):
    if one_call == "each buffer":  # a group too big to compare in one call
        monkeypatch.setattr(policy, "_ONE_COMPARE_BYTES", 0)
    assert tl.summary(Buffers("none"), torch.rand(3)).receipt.restored_buffers == []
    model = Buffers("write")
    before = {name: b.clone() for name, b in model.named_buffers()}
    s = tl.summary(model, torch.rand(3))
    assert s.receipt.restored_buffers == ["zero", "m"] and s.receipt.verified
    for name, b in model.named_buffers():
        assert b.dtype == before[name].dtype and b.shape == before[name].shape
        assert torch.equal(b.reshape(-1).view(torch.uint8),
                           before[name].reshape(-1).view(torch.uint8)), name


@pytest.mark.parametrize("one_call", ["one call", "each buffer"])
def test_an_in_place_write_of_equal_values_to_a_buffer_changes_nothing(one_call, monkeypatch):
    if one_call == "each buffer":
        monkeypatch.setattr(policy, "_ONE_COMPARE_BYTES", 0)
    model = Buffers("equal")
    versions = {name: b._version for name, b in model.named_buffers()}
    r = tl.summary(model, torch.rand(3)).receipt
    assert model.count._version > versions["count"] and model.a._version > versions["a"]
    assert r.verified and r.hash_before == r.hash_after
    assert not (r.restored_buffers or r.changed)


class Clipped(nn.Module):
    """A forward that clips its own weight in place (a WGAN critic's weight clipping) in three
    ways; with ``limit`` above every weight, each write leaves the values as they were."""

    def __init__(self, how: str, limit: float):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.how, self.limit = nn.Linear(4, 4), how, limit
        self.tied = nn.Linear(4, 4)
        self.tied.weight = self.fc.weight  # the written parameter under two names

    def forward(self, x):
        w = self.fc.weight
        if self.how == "no_grad":
            with torch.no_grad():
                w.clamp_(-self.limit, self.limit)
        elif self.how == "data":
            w.data.clamp_(-self.limit, self.limit)
        else:
            torch.clamp(w.data, -self.limit, self.limit, out=w.data)
        return self.tied(self.fc(x))


@pytest.mark.parametrize("how", ["no_grad", "data", "out"])
def test_an_in_place_write_of_equal_values_to_a_parameter_verifies(how):
    """The bytes decide, not the version counter: a copy of a parameter is taken just before
    its first in-place write (in the warm-up forward of the first summary too), so a write that
    changes nothing verifies, and one that changes a value still fails naming it."""
    model = Clipped(how, limit=10.0)
    weight = model.fc.weight.detach().clone()
    for _ in range(2):  # with the warm-up forward, then without
        r = tl.summary(model, torch.rand(3, 4)).receipt
        assert r.verified and not r.changed and torch.equal(model.fc.weight, weight)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(Clipped(how, limit=0.01), torch.rand(3, 4))
    assert err.value.code == "state_restore_failed"
    assert "['fc.weight', 'tied.weight']" in str(err.value)  # the written tensor by each name


def test_a_buffer_given_data_of_another_dtype_fails_naming_it():
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(Buffers("dtype"), torch.rand(3))
    assert err.value.code == "state_restore_failed" and "['a']" in str(err.value)


class Unusual(nn.Module):
    """A sparse and a quantized buffer (neither can be flattened into the others' copy); the
    forward may overwrite the sparse one."""

    def __init__(self, write: bool):
        super().__init__()
        self.register_buffer("sparse", torch.eye(3).to_sparse())
        self.register_buffer("quantized",
                             torch.quantize_per_tensor(torch.arange(4.0), 0.5, 0, torch.quint8))
        self.lin = nn.Linear(3, 3)
        self.write = write

    def forward(self, x):
        if self.write:
            self.sparse.copy_(torch.zeros(3, 3).to_sparse())
        return self.lin(x)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")  # deprecated dtypes
@pytest.mark.parametrize("write", [False, True])
def test_sparse_and_quantized_buffers_are_checked_and_restored(write):
    model = Unusual(write)
    quantized = model.quantized.int_repr().clone()
    r = tl.summary(model, torch.rand(2, 3)).receipt
    assert r.verified and r.restored_buffers == (["sparse"] if write else [])
    assert torch.equal(model.sparse.to_dense(), torch.eye(3))
    assert torch.equal(model.quantized.int_repr(), quantized)
    assert set(state_fingerprints(model)) == {"lin.weight", "lin.bias", "sparse", "quantized"}


def test_replaced_parameter_fails_naming_it_and_original_is_back():
    model = Net("replace")
    original, h0 = model.w, state_hash(model)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, torch.rand(3))
    assert err.value.code == "state_restore_failed"
    assert "replaced parameters ['w']" in str(err.value)
    assert model.w is original and state_hash(model) == h0  # equal content: only identity tells


def test_training_flag_is_restored_and_named():
    model = Net("train_flag").eval()
    s = tl.summary(model, torch.rand(3))
    assert s.receipt.restored_flags == ["sub"] and s.receipt.verified
    assert not model.sub.training and not model.training
    assert "training flags set by the forward ['sub']" in str(s).splitlines()[-1]


def test_a_clean_forward_names_nothing():
    s = tl.summary(Net("none").train(), torch.rand(3))
    r = s.receipt
    assert r.verified and not (r.restored_buffers or r.restored_flags or r.replaced or r.changed)
    assert str(s).splitlines()[-1].endswith(")")


def _flip(t: torch.Tensor, *index: int) -> torch.Tensor:
    """``t`` with one element's lowest bit flipped."""
    out = t.clone()
    out.view(torch.int32).view(-1)[list(index)] ^= 1
    return out


def _swap(t: torch.Tensor, i: int, j: int) -> torch.Tensor:
    out = t.clone()
    flat = out.view(-1)
    flat[i], flat[j] = t.view(-1)[j], t.view(-1)[i]
    return out


def test_fingerprint_sees_one_element_and_any_swap_of_two():
    torch.manual_seed(1)
    t = torch.randn(700 * WIDE * 2 + 3)  # float32: 700 int64 rows (over the CPU block) + a tail
    base = _fp(t)
    assert _fp(t.clone()) == base  # the same content in another tensor object
    for i in (0, 5, 2 * WIDE * 300 + 17, t.numel() - 1):
        assert _fp(_flip(t, i)) != base, i
    swaps = [(0, 1),  # two float32 in one int64 word
             (2, 10),  # one row, other columns
             (4, 4 + 2 * WIDE),  # one column, the next row
             (6, 6 + 2 * WIDE * 333),  # one column, far rows (other CPU blocks)
             (9, 2 * WIDE * 500 + 101),  # other row and column
             (12, t.numel() - 2)]  # the grid and the tail
    for i, j in swaps:
        assert t.view(-1)[i] != t.view(-1)[j]
        assert _fp(_swap(t, i, j)) != base, (i, j)


def test_fingerprint_of_odd_sized_and_non_contiguous_tensors():
    torch.manual_seed(2)
    odd = torch.randn(3 * WIDE * 4 + 5, dtype=torch.float16)  # nbytes % 8 == 2
    assert odd.numel() * odd.element_size() % 8
    assert _fp(odd.clone()) == _fp(odd)
    for i in (0, odd.numel() - 1):
        changed = odd.clone()
        changed.view(torch.int16)[i] ^= 1
        assert _fp(changed) != _fp(odd)
    wide = torch.randn(300, 4 * WIDE)
    for view in (wide.t(), wide[:, ::3], wide[1:, 1:]):
        assert not view.is_contiguous()
        assert _fp(view) == _fp(view.contiguous())
        assert _fp(_flip(view.contiguous(), 5)) != _fp(view)
    offset = wide.view(-1)[1:1 + 8 * WIDE]  # a storage offset that is no whole int64 word
    assert _fp(offset) == _fp(offset.clone())


def test_fingerprint_of_other_dtypes_and_shapes():
    for t in (torch.tensor(3.0), torch.empty(0), torch.arange(5000) % 2 == 0,
              torch.randn(3000, dtype=torch.complex64), torch.randn(2, 3000, dtype=torch.bfloat16),
              torch.randint(0, 9, (7, 3001), dtype=torch.int8)):
        assert _fp(t) == _fp(t.clone())
    assert _fp(torch.zeros(2048)) != _fp(torch.zeros(1024, 2)) != _fp(torch.zeros(2048).double())
    assert _fp(torch.tensor([0.0] * 2048)) != _fp(torch.tensor([-0.0] + [0.0] * 2047))


def test_a_tied_tensor_is_read_once_and_named_twice():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    prints = state_fingerprints(model)
    assert prints["0.weight"] == prints["1.weight"]


def test_the_accelerator_path_gives_the_host_fingerprints():
    """On an accelerator the sums run unblocked where the tensors live and come back in one
    copy; that path (forced here on CPU tensors) must give the same digests."""
    torch.manual_seed(3)
    tensors = [torch.randn(900, WIDE), torch.randn(5), torch.randn(3 * WIDE + 1).half()]
    assert policy._digests(tensors, host=()) == policy._digests(tensors)
    changed = tensors[0].clone()
    changed.view(-1)[12345] += 1
    device_path = policy._digests([changed, tensors[1]], host=())
    assert device_path[id(changed)] != policy._digests(tensors)[id(tensors[0])]
    assert device_path[id(tensors[1])] == policy._digests(tensors)[id(tensors[1])]


def test_the_receipt_reads_no_tensor_bytes(monkeypatch):
    """Its cost must not grow with the state dict: no fingerprint of any tensor's bytes."""
    from torchlens.capture import policy as pol

    def refuse(*args, **kwargs):
        raise AssertionError("the receipt read tensor bytes")

    monkeypatch.setattr(pol, "state_fingerprints", refuse)
    monkeypatch.setattr(pol, "_digests", refuse)
    model = Net("none", SIZES["large"])
    s = tl.summary(model, torch.rand(3))
    assert s.receipt.verified and not s.receipt.changed
    with pytest.raises(tl.TorchLensError):
        tl.summary(Net("data", SIZES["large"]), torch.rand(3))
