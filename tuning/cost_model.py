"""DietCode's cost model: throughput(P, M) = f_MK(features(M)) * f_occ(P/M) * f_pad(P, M).

f_MK is the micro-kernel's own throughput when every core is busy and no work
is padding, learned by XGBoost from micro-kernel features alone, so one model
serves every shape of the workload (joint learning). f_occ models cores left
idle in the last wave of tasks, with its coefficient k fitted to this
machine's measurements; f_pad is the useful fraction of the padded work. The
model is an estimator (fit / predict) over measurement records.

`hw` is the target: the CPU's Hardware or a GPU's GpuTarget
(tuning/cuda/target.py). Each says what a kernel's features, parallel tasks
and padded work are, and how many parallel units (cores, SMs) run the tasks.
"""

import math

import numpy as np
from scipy.interpolate import RegularGridInterpolator

from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.workload import Workload

OCCUPANCY_GRID = np.linspace(0.0, 1.0, 21)


def f_occ(tasks, cores: int, k: float):
    """k * tasks / ceil_by(tasks, cores) + (1 - k): 1 when the last wave fills every core
    (no tasks: 1). Elementwise over an array of task counts."""
    tasks = np.asarray(tasks)
    waves = -(-tasks // cores) * cores
    return np.where(waves == 0, 1.0, k * tasks / np.maximum(waves, 1) + (1.0 - k))


def f_pad(workload: Workload, kernel, dims: dict, hw):
    """Useful fraction of the computed (padded) output (nothing computed: 1). Elementwise over arrays of dims."""
    computed = np.asarray(hw.computed_elements(workload, kernel, dims))
    return np.where(computed == 0, 1.0, dims["b"] * dims["m"] * dims["n"] / np.maximum(computed, 1))


class CostModel:
    """Predicts GFLOP/s of any micro-kernel at any M of one workload."""

    def __init__(self, workload: Workload, hw, seed: int = 0):
        self.workload, self.hw, self.seed = workload, hw, seed
        self.k = 1.0
        self._booster = None

    def shape_factor(self, kernel, shape: tuple[int, ...]) -> float:
        """f_occ * f_pad of kernel at a shape (values of the workload's variables)."""
        return shape_factor(self.workload, kernel, shape, self.hw, self.k)

    def fit(self, measurements: list[Measurement]) -> "CostModel":
        import xgboost

        usable = [r for r in measurements if r.seconds]
        if not usable:
            return self
        self.k = fit_occupancy(usable, self.workload, self.hw)
        by_kernel = kernel_throughputs(usable, self)
        kernels = sorted(by_kernel)
        self._booster = xgboost.XGBRegressor(n_estimators=120, max_depth=4, learning_rate=0.15,
                                             random_state=self.seed, n_jobs=1)
        self._booster.fit(np.array([self.hw.kernel_features(k) for k in kernels]),
                          np.log([by_kernel[k] for k in kernels]))
        return self

    @property
    def fitted(self) -> bool:
        return self._booster is not None

    def predict_mk(self, kernels: list) -> np.ndarray:
        """f_MK: GFLOP/s of each kernel at full occupancy with no padding."""
        return np.exp(self._booster.predict(np.array([self.hw.kernel_features(k) for k in kernels])))

    def shape_factors(self, kernels: list, shapes: list[tuple[int, ...]]) -> np.ndarray:
        """f_occ * f_pad of each kernel (rows) at each shape (columns)."""
        dims = self.workload.dims_over(shapes)  # arrays: one numpy expression per kernel covers every shape
        return np.array([_shape_factor(self.workload, kernel, dims, self.hw, self.k)
                         for kernel in kernels]).reshape(len(kernels), len(shapes))

    def predict(self, kernels: list, shapes: list[tuple[int, ...]]) -> np.ndarray:
        """GFLOP/s of each kernel (rows) at each shape (columns)."""
        return self.predict_mk(kernels)[:, None] * self.shape_factors(kernels, shapes)


def shape_factor(workload: Workload, kernel, shape: tuple[int, ...], hw, k: float) -> float:
    return float(_shape_factor(workload, kernel, workload.dims_at(shape), hw, k))


def _shape_factor(workload: Workload, kernel, dims: dict, hw, k: float):
    return f_occ(hw.task_count(workload, kernel, dims), hw.cores, k) * f_pad(workload, kernel, dims, hw)


def observed_gflops(workload: Workload, record: Measurement) -> float:
    return workload.flops(workload.dims_at(record.shape)) / record.seconds / 1e9


def _normalized_logs(measurements: list[Measurement], workload: Workload, hw, k: float) -> dict:
    """Per kernel, log of each successful measurement's GFLOP/s divided by f_occ * f_pad."""
    logs: dict = {}
    for record in measurements:
        if record.seconds:
            factor = shape_factor(workload, record.kernel, record.shape, hw, k)
            logs.setdefault(record.kernel, []).append(math.log(observed_gflops(workload, record) / factor))
    return logs


def kernel_throughputs(measurements: list[Measurement], model: CostModel) -> dict:
    """Each measured kernel's f_MK: its observed GFLOP/s with shape effects divided out
    (geometric mean over its shapes)."""
    logs = _normalized_logs(measurements, model.workload, model.hw, model.k)
    return {kernel: math.exp(sum(v) / len(v)) for kernel, v in logs.items()}


def fit_occupancy(measurements: list[Measurement], workload: Workload, hw) -> float:
    """The k that makes each kernel's normalized throughput most constant across shapes."""
    best_k, best_spread = 1.0, math.inf
    for k in OCCUPANCY_GRID:
        logs = _normalized_logs(measurements, workload, hw, float(k))
        spread = sum(float(np.var(values)) * len(values) for values in logs.values())
        if spread < best_spread - 1e-12:
            best_k, best_spread = float(k), spread
    return best_k


def calibrated_gflops(measurements: list[Measurement], model: CostModel, kernels: list,
                      shapes: list[tuple[int, ...]]) -> np.ndarray:
    """GFLOP/s of measured kernels (rows) at any shapes (columns): the cost formula
    f_MK * f_occ * f_pad times its own error at the shapes each kernel was measured at,
    interpolated between them in log size, so it reproduces every measurement.

    Why: f_MK averages a kernel over its shapes, and where a shape is memory-bound
    (M = 1 streams the whole weight whatever the tile) dividing by f_pad credits
    tall tiles with throughput they reach only at large M. Uncorrected, dispatch
    on a Zen 1 machine ran a kernel measured at 53 GFLOP/s where another measured 64.
    """
    throughputs = kernel_throughputs(measurements, model)
    errors: dict = {}  # kernel -> shape -> log errors
    for record in measurements:
        if record.seconds and record.kernel in throughputs:
            formula = throughputs[record.kernel] * model.shape_factor(record.kernel, record.shape)
            errors.setdefault(record.kernel, {}).setdefault(record.shape, []).append(
                math.log(observed_gflops(model.workload, record) / formula))
    log_shapes = np.log(np.maximum(np.array(shapes, dtype=float), 1.0))
    return (np.array([throughputs[kernel] for kernel in kernels])[:, None] * model.shape_factors(kernels, shapes)
            * np.exp([_interpolate(errors[k], log_shapes) for k in kernels]))


def _interpolate(errors: dict[tuple[int, ...], list[float]], log_shapes: np.ndarray) -> np.ndarray:
    """Mean log error per measured shape, multilinear in log size over the grid of measured
    values, held constant past its ends; grid points without a measurement count as 0."""
    axes = [sorted({shape[i] for shape in errors}) for i in range(log_shapes.shape[1])]
    grid = np.zeros([len(a) for a in axes])
    for shape, values in errors.items():
        grid[tuple(a.index(v) for a, v in zip(axes, shape))] = np.mean(values)
    varying = [i for i, a in enumerate(axes) if len(a) > 1]
    grid = grid.reshape([len(axes[i]) for i in varying])  # single-valued axes drop out
    if not varying:
        return np.full(len(log_shapes), float(grid))
    log_axes = [np.log(np.maximum(axes[i], 1)) for i in varying]
    points = np.stack([np.clip(log_shapes[:, i], a[0], a[-1]) for i, a in zip(varying, log_axes)], axis=1)
    return RegularGridInterpolator(log_axes, grid)(points)
