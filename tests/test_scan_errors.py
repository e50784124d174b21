"""evt.scan's user-facing errors: one test per error, asserting the class and that the message names the thing."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import evtorch as evt
from evtorch.errors import EpilogueError, ShapeError
from evtorch.scan import (ScanConfig, ScanControlFlowError, ScanError, ScanShapeError, ScanStepError, ScanTraceError,
                          ScanUnsupportedOpError)

X = torch.randn(10, 4)


def raises(cls, *fragments):
    class Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(cls)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.ctx.__exit__(*exc)
            text = str(self.info.value)
            for f in fragments:
                assert f in text, f"{f!r} not in: {text}"
            assert issubclass(cls, EpilogueError)
            return out
    return Ctx()


def test_reading_the_current_step():
    with raises(ScanStepError, "state 'h'", "step t+0", "the step being computed", "test_scan_errors.py"):
        evt.scan(lambda h, x: h.at(0) + x, X)


def test_reading_a_later_step():
    with raises(ScanStepError, "state 'h'", "step t+1", "a later step"):
        evt.scan(lambda h, x: h.at(1) + x, X)
    with raises(ScanStepError, "input 'x'", "a later step"):
        evt.scan(lambda h, x: h + x.at(2), X)


def test_reading_before_init():
    with raises(ScanStepError, "state 'h'", "step t-2", "init gives only 1 step", "at least 2 rows"):
        evt.scan(lambda h, x: h.at(-2) + x, X)


def test_at_on_a_computed_value():
    with raises(ScanTraceError, ".at(offset)"):
        evt.scan(lambda h, x: (h + x).at(-1), X)


def test_init_and_state_shapes_disagree():
    with raises(ScanShapeError, "state 0 (h)", "(4, 4)", "init gives rows of shape (4,)"):
        evt.scan(lambda h, x: h[..., None] + x, X)
    # a 1-D init is k steps of scalar rows (the message read "(init has shape (k, )) along the scan dim)")
    with raises(ScanShapeError, "rows of shape (4,)", "init gives rows of shape ()", "init's shape is (k,)",
                "init[None]"):
        evt.scan(lambda h, x: h + x, X, init=torch.zeros(4))
    with raises(ShapeError, "h(3,)", "x(4,)"):
        evt.scan(lambda h, x: h + x, X, init=torch.zeros(1, 3))


def test_wrong_number_of_states():
    with raises(ScanShapeError, "returned 1 value(s)", "2 state(s)", "(a, b)"):
        evt.scan(lambda a, b, x: a + x, X, init=(X[:1], X[:1]))


def test_inits_with_different_k_and_too_long():
    with raises(ScanShapeError, "different numbers of steps", "(1, 2)"):
        evt.scan(lambda a, b, x: (a + x, b), X, init=(X[:1], X[:2]))
    with raises(ScanShapeError, "init gives 11 steps", "T = 10"):
        evt.scan(lambda h, x: h + x, X, init=torch.zeros(11, 4))


def test_inputs_of_different_lengths():
    with raises(ScanShapeError, "different lengths", "input 0: 10", "input 1: 5"):
        evt.scan(lambda h, x, y: h + x, X, X[:5])


def test_untraceable_bodies():
    with raises(ScanTraceError, "returned a float"):
        evt.scan(lambda h, x: 3.0, X)
    with raises(ScanControlFlowError, "bool()", "scan body", "torch.where"):
        evt.scan(lambda h, x: h if h > 0 else x, X)
    with raises(ScanTraceError, "could not be traced", "IndexError"):
        evt.scan(lambda h, x: h + [1, 2][5], X)
    with raises(ScanUnsupportedOpError, "torch.cumsum", "scan body"):
        evt.scan(lambda h, x: torch.cumsum(h, 0), X)
    with raises(ScanTraceError, "takes 1 parameter(s)", "passes 2"):
        evt.scan(lambda h: h, X)


def test_captured_tensor_and_reduction():
    with raises(ScanTraceError, "captured from outside the scan body or made inside it", "(10, 4)"):
        evt.scan(lambda h, x: h + torch.relu(X), X)
    with raises(ScanTraceError, "captured from outside the scan body or made inside it", "(4,)", "as a number"):
        evt.scan(lambda h, x: h + torch.relu(torch.ones(4)), X)
    with raises(ScanTraceError, "sum()", "reductions are not supported"):
        evt.scan(lambda h, x: h + x.sum(), X)


def test_bad_arguments():
    with raises(ScanShapeError, "dim=2"):
        evt.scan(lambda h, x: h + x, X, dim=2)
    with raises(EpilogueError, "backend"):
        evt.scan(lambda h, x: h + x, X, backend="cuda")
    with raises(EpilogueError, "length=T"):
        evt.scan(lambda h: h, init=X[:1])
    with raises(EpilogueError, "input 1 is a float"):
        evt.scan(lambda h, x, y: h + x, X, 2.0)


@pytest.mark.parametrize("dim", [0.0, "0", None, True])
def test_dim_that_is_not_an_int(dim):
    """A float or string dim failed inside torch (``movedim() received an invalid combination of arguments``) or
    Python (``'<=' not supported``) without naming the parameter; True scanned dim 1 (found by a probe,
    2026-11-29)."""
    with raises(EpilogueError, "dim must be an int", repr(dim)):
        evt.scan(lambda h, x: h + x, X, dim=dim)
    assert evt.scan(lambda h, x: h + x, X, dim=torch.tensor(-2)).shape == X.shape  # an integer tensor is an int


@pytest.mark.parametrize("init,what", [((), "an empty tuple"), ((X[:1], None), "a tuple whose element 1 is a NoneType"),
                                       ([X[:1], 2.0], "a list whose element 1 is a float"), (0.0, "got float")])
def test_init_that_is_not_tensors(init, what):
    """A tuple init with a non-tensor element read only 'got tuple' (found by a probe, 2026-11-29)."""
    with raises(EpilogueError, "init must be a tensor or a non-empty tuple or list of tensors", what):
        evt.scan(lambda h, x: h + x, X, init=init)


def test_config_of_the_wrong_type():
    with pytest.raises(evt.EpilogueTypeError, match="ScanConfig"):
        evt.scan(lambda h, x: h + x, torch.randn(4, 2), config="fast", backend="triton")


def test_config_strategy_is_checked_when_built():
    """An unknown strategy met a raw ValueError in the kernel renderer (``threepas``), an AttributeError for a
    non-string, or was ignored on a lane-wise body (found by a probe, 2026-11-29): ScanConfig names it."""
    from evtorch.scan import ScanConfig
    for bad in ("threepas", "threepass/nocarry", 3, ""):
        with pytest.raises(ScanError, match=r"ScanConfig.strategy=.*expected one of 'lookback'"):
            ScanConfig(strategy=bad)
    for good in (None, "lookback", "segmented", "packed", "threepass", "lookback/nocarry", "segmented/nocarry"):
        assert ScanConfig(strategy=good).strategy == good


def test_length_must_be_a_non_negative_integer():
    """length=3.7 silently ran 3 steps and length=-1 blamed init; an integer-like (numpy, 0-d tensor) is accepted."""
    init = torch.zeros(1, 2)
    for bad in (3.7, -1, True, "3"):
        with pytest.raises(ScanError, match="length must be a non-negative int"):
            evt.scan(lambda h: h + 1, init=init, length=bad)
    assert evt.scan(lambda h: h + 1, init=init, length=torch.tensor(3)).shape == (3, 2)


def test_no_steps_and_no_init_says_so():
    """T = 0 with no init said "init has no steps" although no init was given."""
    with pytest.raises(ScanShapeError, match=r"no steps along dim 0 \(T = 0\) and no init"):
        evt.scan(lambda h, x: h + x, torch.randn(0, 2))


@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain", "differentiable"])
def test_triton_backend_on_meta_tensors_is_named(requires_grad):
    """backend='triton' on meta tensors failed inside the interpreter ("Cannot copy out of meta tensor"); the
    reference backend gives the shapes."""
    X = torch.randn(5, 3, device="meta", requires_grad=requires_grad)
    with pytest.raises(evt.EpilogueError, match="backend='triton' runs on CUDA tensors .*got tensors on meta"):
        evt.scan(lambda h, x: h + x, X, backend="triton")
    assert evt.scan(lambda h, x: h + x, X, backend="reference").shape == (5, 3)


def test_sparse_inputs_and_init_are_named():
    """A sparse input (or init) failed inside torch's row views: a raw NotImplementedError "Could not run
    'aten::as_strided' with arguments from the 'SparseCPU' backend"."""
    X = torch.randn(6, 3)
    for backend in ("reference", "triton"):
        with pytest.raises(evt.EpilogueTypeError, match=r"input 0 is a torch.sparse_coo tensor.*to_dense"):
            evt.scan(lambda h, x: h + x, X.to_sparse(), backend=backend)
        with pytest.raises(evt.EpilogueTypeError, match=r"init 1 is a torch.sparse_coo tensor"):
            evt.scan(lambda a, b, x: (a + x, b + x), X, init=(X[:1], X[:1].to_sparse()), backend=backend)


def test_post_returning_nothing_is_named():
    """post=lambda h, x: () made evt.scan return an empty tuple, silently, without running the scan."""
    with raises(ScanTraceError, "post function returned an empty tuple"):
        evt.scan(lambda h, x: h + x, X, post=lambda h, x: ())


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("fn", [lambda h, x: h + x, lambda h, x: torch.tanh(h + x)], ids=["assoc", "lanes"])
def test_deterministic_scan_refuses_a_look_back_strategy_on_every_backend(backend, fn):
    """``deterministic=True`` with ``ScanConfig(strategy='lookback')`` was refused only where the triton backend ran
    an associative body; the reference backend and lane-wise bodies ran it (found by a probe): the same call must
    not pass on the CPU and fail on a GPU."""
    X = torch.randn(9, 4)
    with pytest.raises(ScanError, match=r"config.strategy='lookback'.*deterministic.*threepass"):
        evt.scan(fn, X, backend=backend, deterministic=True, config=ScanConfig(strategy="lookback"))
    evt.scan(fn, X, backend=backend, deterministic=True, config=ScanConfig(strategy="threepass"))
