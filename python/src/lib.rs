//! `attnc._attnc`: the Rust half of the Python package.
//!
//! Python hands tensors over as torch tensors (read here, attribute by attribute) or as
//! plain descriptors — `(data_ptr, dtype, shape, strides, device, capacity)`, from any
//! DLPack / `__cuda_array_interface__` array — and a CUDA stream handle; nothing is
//! copied, and the work goes on the caller's stream. Every tensor goes through the
//! runtime's launch validation, so a bad one is a `ValueError` naming the argument before
//! anything launches. The pure-Python package (`python/attnc`) holds the user-facing API,
//! the torch custom op and autograd; its eager forward is one call here
//! (`Kernel.forward_torch`), which also allocates the outputs: every microsecond of it is
//! a decode step's host time.

use attnc_ir::{KvLayout, ShardPositions, Spec, Ty};
use attnc_lower::{Arch, CompileOptions, Direction, FamilyChoice};
use attnc_runtime::validate::{plan, CombineKind, KernelShape, LaunchDescs, ParamValue};
use attnc_runtime::{
    ElemType, Gradients, IndexTensor, Params, PendingKernel, Receipt, Runtime, RuntimeError, Stream, Tensor,
    ValidationError,
};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// A tensor argument: a torch tensor, read here (the package's torch calls pass them as
/// they are: one attribute read each costs less than building a descriptor in Python),
/// or a descriptor, one flat tuple of ints, from any DLPack / `__cuda_array_interface__`
/// array: `(data_ptr, dtype, device, capacity, *shape, *strides)` with dtype 0 bf16,
/// 1 f16, 2 f32, 3 i32, strides in elements, and capacity the elements reachable from the
/// pointer — `-1` for a framework tensor, whose views lie inside their storage by the
/// framework's own rules (the span of the view is then its capacity).
type TensorArg<'py> = Bound<'py, PyAny>;

/// An index tensor: its tensor argument and its values on the host.
type IndexArg<'py> = (TensorArg<'py>, Vec<i32>);

const DTYPES: [ElemType; 4] = [ElemType::Bf16, ElemType::F16, ElemType::F32, ElemType::I32];

/// torch's dtype objects in `DTYPES` order, looked up once (a dtype is compared by identity).
static TORCH_DTYPES: PyOnceLock<[Py<PyAny>; 4]> = PyOnceLock::new();

fn torch_dtypes(py: Python<'_>) -> PyResult<&[Py<PyAny>; 4]> {
    TORCH_DTYPES.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let get = |name: &str| torch.getattr(name).map(Bound::unbind);
        Ok([get("bfloat16")?, get("float16")?, get("float32")?, get("int32")?])
    })
}

fn tensor(arg: &str, t: &TensorArg<'_>) -> PyResult<Tensor> {
    match t.cast::<PyTuple>() {
        Ok(d) => described_tensor(arg, d),
        Err(_) => torch_tensor(arg, t),
    }
}

/// A torch tensor's view, read from its attributes (no data is touched).
fn torch_tensor(arg: &str, t: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let py = t.py();
    let not_a_tensor = || {
        let ty = t.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        PyValueError::new_err(format!(
            "{arg}: expected a CUDA tensor (torch, or any __cuda_array_interface__ / DLPack array), found {ty}"
        ))
    };
    let is_cuda = t.getattr(intern!(py, "is_cuda")).map_err(|_| not_a_tensor())?;
    if !is_cuda.is_truthy()? {
        let device = t.getattr(intern!(py, "device"))?;
        return Err(PyValueError::new_err(format!("{arg}: must be a CUDA tensor, found device {device}")));
    }
    let dtype = t.getattr(intern!(py, "dtype"))?;
    let code = torch_dtypes(py)?.iter().position(|d| d.bind(py).is(&dtype)).ok_or_else(|| {
        PyValueError::new_err(format!("{arg}: dtype {dtype} is not supported (bfloat16, float16, float32 or int32)"))
    })?;
    let device: usize = t.call_method0(intern!(py, "get_device"))?.extract()?;
    let ptr: u64 = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let shape: Vec<usize> = ints(arg, &t.getattr(intern!(py, "shape"))?, "sizes")?;
    let strides: Vec<usize> = ints(arg, &t.call_method0(intern!(py, "stride"))?, "strides")?;
    view(arg, device, ptr, DTYPES[code], &shape, &strides, None)
}

/// The non-negative ints of a tuple (a torch.Size, a stride tuple).
fn ints(arg: &str, tuple: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    let tuple = tuple.cast::<PyTuple>().map_err(|_| PyValueError::new_err(format!("{arg}: {what} are not a tuple")))?;
    tuple
        .iter()
        .map(|x| {
            let x: i64 = x.extract()?;
            usize::try_from(x).map_err(|_| PyValueError::new_err(format!("{arg}: negative {what} are not supported")))
        })
        .collect()
}

/// A descriptor tuple's view.
fn described_tensor(arg: &str, d: &Bound<'_, PyTuple>) -> PyResult<Tensor> {
    let bad = || PyValueError::new_err(format!("{arg}: malformed tensor descriptor"));
    let n = d.len();
    if n < 4 || (n - 4) % 2 != 0 {
        return Err(bad());
    }
    let int = |i: usize| -> PyResult<i64> { d.get_item(i)?.extract::<i64>() };
    let ptr = u64::try_from(int(0)?).map_err(|_| bad())?;
    let dtype = *usize::try_from(int(1)?).ok().and_then(|c| DTYPES.get(c)).ok_or_else(bad)?;
    let device = usize::try_from(int(2)?).map_err(|_| bad())?;
    let capacity = int(3)?;
    let rank = (n - 4) / 2;
    let (mut shape, mut strides) = (Vec::with_capacity(rank), Vec::with_capacity(rank));
    for i in 0..rank {
        let dim = usize::try_from(int(4 + i)?).map_err(|_| bad())?;
        let stride = usize::try_from(int(4 + rank + i)?)
            .map_err(|_| PyValueError::new_err(format!("{arg}: negative strides are not supported")))?;
        shape.push(dim);
        strides.push(stride);
    }
    let capacity = if capacity < 0 { None } else { Some(usize::try_from(capacity).map_err(|_| bad())?) };
    view(arg, device, ptr, dtype, &shape, &strides, capacity)
}

/// The runtime's view of caller memory; `capacity` None: a framework tensor, whose view
/// lies inside its storage (its span is its capacity).
fn view(
    arg: &str,
    device: usize,
    ptr: u64,
    dtype: ElemType,
    shape: &[usize],
    strides: &[usize],
    capacity: Option<usize>,
) -> PyResult<Tensor> {
    let capacity = capacity.unwrap_or_else(|| {
        if shape.contains(&0) {
            0
        } else {
            shape.iter().zip(strides).map(|(&n, &s)| (n - 1).saturating_mul(s)).fold(1, usize::saturating_add)
        }
    });
    // SAFETY: the tensor is alive for the call: the Python caller holds it (and, for work
    // queued on its stream, the stream-ordered allocator of its framework keeps the memory
    // until that work has run).
    unsafe { Tensor::from_raw_parts(device, ptr, dtype, shape, strides, capacity) }
        .map_err(|e| PyValueError::new_err(format!("{arg}: {e}")))
}

/// The shapes of O and LSE for Q of `q_shape`: O is Q's with the value head dim, LSE is
/// `[batch, q_heads, seqlen_q]` (varlen `[q_heads, total_q]`). A Q of the wrong rank gets
/// O of its own rank and an empty LSE: the launch's validation rejects it by name.
/// `attnc.torch._out_shapes` is its twin for traced calls (fake tensors with symbolic
/// sizes, which only Python sees); the two must agree.
fn output_shapes(spec: &Spec, q_shape: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut o = q_shape.to_vec();
    if let Some(last) = o.last_mut() {
        *last = spec.head_dim_v as usize;
    }
    let lse = match (spec.kv_layout, q_shape) {
        (KvLayout::Varlen, &[total, heads, _]) => vec![heads, total],
        (KvLayout::Contiguous | KvLayout::Paged { .. }, &[batch, seqlen, heads, _]) => vec![batch, heads, seqlen],
        _ => vec![0],
    };
    (o, lse)
}

/// The view of a tensor just allocated on Q's device (`new_empty`, `empty_like`): its
/// address and strides are read, the rest is known.
fn fresh_view(arg: &str, t: &Bound<'_, PyAny>, dtype: ElemType, shape: &[usize], device: usize) -> PyResult<Tensor> {
    let py = t.py();
    let ptr: u64 = t.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let strides = ints(arg, &t.call_method0(intern!(py, "stride"))?, "strides")?;
    view(arg, device, ptr, dtype, shape, &strides, None)
}

/// `torch.empty_like`, looked up once.
static TORCH_EMPTY_LIKE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn torch_empty_like(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    TORCH_EMPTY_LIKE.get_or_try_init(py, || Ok(py.import("torch")?.getattr("empty_like")?.unbind()))
}

/// A `{name: tensor argument}` dict as tensors sorted by name; `what` names them in errors.
fn named_tensors(what: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Tensor)>> {
    let given: HashMap<String, TensorArg<'_>> = value.extract()?;
    let mut out = given
        .into_iter()
        .map(|(name, d)| Ok((name.clone(), tensor(&format!("{what} `{name}`"), &d)?)))
        .collect::<PyResult<Vec<_>>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn index_tensor(arg: &str, d: &IndexArg<'_>) -> PyResult<IndexTensor> {
    let t = tensor(arg, &d.0)?;
    // SAFETY: the Python side read `d.1` from the same tensor (or the caller passed
    // both, as the docs require).
    unsafe { IndexTensor::from_parts(t, d.1.clone()) }.map_err(|e| PyValueError::new_err(format!("{arg}: {e}")))
}

/// A runtime error as the Python exception a user expects.
fn py_err(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Validation(v) => PyValueError::new_err(v.to_string()),
        RuntimeError::BlockMask(m) => PyValueError::new_err(format!("block mask: {m}")),
        RuntimeError::Lower(attnc_lower::LowerError::NoSuchPass { direction, reason }) => {
            PyNotImplementedError::new_err(format!("no {direction} pass for this variant: {reason}"))
        }
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

fn validation_err(e: ValidationError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The arguments beside Q, K, V, O and LSE, owned for the length of a call.
#[derive(Default)]
struct Extras {
    values: Vec<(String, ParamValue)>,
    aux: Vec<(String, Tensor)>,
    sinks: Option<Tensor>,
    cu_seqlens: Option<(IndexTensor, IndexTensor)>,
    paged: Option<(IndexTensor, IndexTensor)>,
    splits: Option<u32>,
    deterministic: bool,
    dsinks: Option<Tensor>,
    aux_grads: Vec<(String, Tensor)>,
    stream: Option<Stream>,
    block_mask: Option<Py<BlockMask>>,
    positions: Option<ShardPositions>,
    sequence_positions: Option<(IndexTensor, bool)>,
}

impl Extras {
    /// Reads the `extras` dict of the Python side: `params`, `aux`, `sinks`,
    /// `cu_seqlens` (q, k), `paged` (block_table, seqused_k), `splits`, `deterministic`,
    /// `dsinks`, `aux_grads`. Unknown keys are an error (a typo must not pass silently).
    fn from_py(spec: &Spec, extras: Option<&Bound<'_, PyDict>>, stream: Option<usize>) -> PyResult<Extras> {
        // SAFETY: the handle is the caller's current stream of the device's primary
        // context (torch.cuda.current_stream().cuda_stream), alive while work runs on it.
        let mut x = Extras { stream: stream.map(|s| unsafe { Stream::from_raw(s) }), ..Extras::default() };
        let Some(extras) = extras else {
            return check_params(spec, x);
        };
        for (key, value) in extras.iter() {
            let key: String = key.extract()?;
            match key.as_str() {
                "params" => {
                    let given: HashMap<String, Bound<'_, PyAny>> = value.extract()?;
                    for (name, v) in given {
                        let decl = spec.params.iter().find(|p| p.name == name).ok_or_else(|| {
                            PyValueError::new_err(format!("param `{name}`: the variant `{}` declares no such param", spec.name))
                        })?;
                        let pv = match decl.ty {
                            Ty::Int => ParamValue::Int(v.extract::<i32>().map_err(|_| {
                                PyValueError::new_err(format!("param `{name}`: expected an int"))
                            })?),
                            _ => ParamValue::Float(v.extract::<f32>().map_err(|_| {
                                PyValueError::new_err(format!("param `{name}`: expected a float"))
                            })?),
                        };
                        x.values.push((name, pv));
                    }
                }
                "aux" => x.aux = named_tensors("aux", &value)?,
                "aux_grads" => x.aux_grads = named_tensors("aux gradient", &value)?,
                "sinks" => x.sinks = Some(tensor("sinks", &value)?),
                "dsinks" => x.dsinks = Some(tensor("dsinks", &value)?),
                "cu_seqlens" => {
                    let (q, k): (IndexArg<'_>, IndexArg<'_>) = value.extract()?;
                    x.cu_seqlens = Some((index_tensor("cu_seqlens_q", &q)?, index_tensor("cu_seqlens_k", &k)?));
                }
                "paged" => {
                    let (bt, used): (IndexArg<'_>, IndexArg<'_>) = value.extract()?;
                    x.paged = Some((index_tensor("block_table", &bt)?, index_tensor("seqused_k", &used)?));
                }
                "splits" => x.splits = Some(value.extract()?),
                "deterministic" => x.deterministic = value.extract()?,
                "block_mask" => x.block_mask = Some(value.extract::<Py<BlockMask>>()?),
                "positions" => {
                    let (q_offset, k_offset, seqlen_q, seqlen_k, sinks): (usize, usize, usize, usize, bool) =
                        value.extract().map_err(|_| {
                            PyValueError::new_err(
                                "positions: expected (q_offset, k_offset, seqlen_q, seqlen_k, sinks) with non-negative ints",
                            )
                        })?;
                    x.positions = Some(ShardPositions { q_offset, k_offset, seqlen_q, seqlen_k, sinks });
                }
                "sequence_positions" => {
                    let (table, sinks): (IndexArg<'_>, bool) = value.extract()?;
                    x.sequence_positions = Some((index_tensor("sequence_positions", &table)?, sinks));
                }
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown argument `{other}` (expected params, aux, sinks, cu_seqlens, paged, splits, deterministic, dsinks, aux_grads, block_mask, positions, sequence_positions)"
                    )))
                }
            }
        }
        check_params(spec, x)
    }

    fn params(&self) -> Params<'_> {
        let mut p = Params { values: self.values.clone(), ..Params::default() };
        for (n, t) in &self.aux {
            p = p.aux(n, t);
        }
        for (n, t) in &self.aux_grads {
            p = p.aux_grad(n, t);
        }
        if let Some(s) = &self.sinks {
            p = p.sinks(s);
        }
        if let Some(s) = &self.dsinks {
            p = p.dsinks(s);
        }
        if let Some((q, k)) = &self.cu_seqlens {
            p = p.varlen(q, k);
        }
        if let Some((bt, used)) = &self.paged {
            p = p.paged(bt, used);
        }
        if let Some(n) = self.splits {
            p = p.splits(n);
        }
        if let Some(s) = self.stream {
            p = p.on_stream(s);
        }
        if let Some(m) = &self.block_mask {
            p = p.block_mask(&m.get().inner);
        }
        if let Some(sp) = self.positions {
            p = p.positions(sp);
        }
        if let Some((t, sinks)) = &self.sequence_positions {
            p = p.sequence_positions(t, *sinks);
        }
        p.deterministic(self.deterministic)
    }
}

/// Every declared param is given (the runtime checks it too; this names the Python way).
fn check_params(spec: &Spec, x: Extras) -> PyResult<Extras> {
    for p in &spec.params {
        if !x.values.iter().any(|(n, _)| n == &p.name) {
            return Err(PyValueError::new_err(format!(
                "param `{}`: missing (the variant `{}` declares it; pass params={{\"{}\": ...}})",
                p.name, spec.name, p.name
            )));
        }
    }
    Ok(x)
}

/// A parsed, validated `.attn` variant.
#[pyclass(frozen, module = "attnc._attnc")]
struct Variant {
    spec: Spec,
}

#[pymethods]
impl Variant {
    #[getter]
    fn name(&self) -> String {
        self.spec.name.clone()
    }

    /// The spec as JSON (the Python side reads heads, head dims, layout, params, aux).
    fn spec_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.spec).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The canonical `.attn` text of the variant.
    fn source(&self) -> String {
        attnc_dsl::print(&self.spec)
    }

    /// PyTorch FlexAttention source of the variant (`make(seqlen_q, seqlen_k, params,
    /// aux) -> (mask_mod, score_mod)`), and what FlexAttention cannot express.
    fn flex_source(&self) -> (String, Vec<String>) {
        let f = attnc_ir::flex_source(&self.spec);
        (f.source, f.unsupported)
    }

    /// PTX of one direction for one arch (`sm_80`, `sm_90a`, `sm_100a`), no GPU needed.
    #[pyo3(signature = (arch = "sm_90a", direction = "forward", family = "auto"))]
    fn ptx(&self, py: Python<'_>, arch: &str, direction: &str, family: &str) -> PyResult<String> {
        let arch: Arch = arch.parse().map_err(PyValueError::new_err)?;
        let direction = match direction {
            "forward" => Direction::Forward,
            "backward" => Direction::Backward,
            other => return Err(PyValueError::new_err(format!("direction `{other}`: forward or backward"))),
        };
        let family: FamilyChoice = family.parse().map_err(PyValueError::new_err)?;
        let opts = CompileOptions { arch, family, direction };
        let spec = self.spec.clone();
        py.detach(move || attnc_lower::compile(&spec, &opts))
            .map(|m| m.ptx)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// What the mask allows between queries `[q_lo, q_hi)` and keys `[k_lo, k_hi)` of
    /// sequences `seqlen_q` × `seqlen_k` long, for any batch entry and head, by the interval
    /// analysis (aux values unknown): "empty" (no pair: a shard pair that needs no launch),
    /// "full" or "partial". `int_params`: the int params' values by name (others unknown).
    #[pyo3(signature = (q_lo, q_hi, k_lo, k_hi, seqlen_q, seqlen_k, int_params = None))]
    #[allow(clippy::too_many_arguments)]
    fn classify_block(
        &self,
        q_lo: i64,
        q_hi: i64,
        k_lo: i64,
        k_hi: i64,
        seqlen_q: i64,
        seqlen_k: i64,
        int_params: Option<HashMap<String, i64>>,
    ) -> PyResult<&'static str> {
        if q_lo >= q_hi || k_lo >= k_hi || q_lo < 0 || k_lo < 0 {
            return Err(PyValueError::new_err("classify_block: expected non-empty ranges of non-negative positions"));
        }
        let mut t = attnc_ir::TileQuery::unbounded(&self.spec);
        t.q = attnc_ir::IntRange::new(q_lo, q_hi - 1);
        t.k = attnc_ir::IntRange::new(k_lo, k_hi - 1);
        t.seqlen_q = attnc_ir::IntRange::point(seqlen_q);
        t.seqlen_k = attnc_ir::IntRange::point(seqlen_k);
        let given = int_params.unwrap_or_default();
        t.params = self
            .spec
            .params
            .iter()
            .map(|p| (p.ty == Ty::Int).then(|| given.get(&p.name).map(|&v| attnc_ir::IntRange::point(v))).flatten())
            .collect();
        Ok(match attnc_ir::classify(&self.spec, &t) {
            attnc_ir::TileClass::Empty => "empty",
            attnc_ir::TileClass::Full => "full",
            attnc_ir::TileClass::Partial => "partial",
        })
    }

    /// Validates a forward launch's arguments on the host, without a GPU: the checks a
    /// launch makes before anything runs (dtypes, shapes, strides, alignment, bounds,
    /// aliasing, params, aux tensors, varlen and paged metadata).
    #[pyo3(signature = (q, k, v, o, lse = None, extras = None, device = 0))]
    fn check_forward(
        &self,
        q: TensorArg<'_>,
        k: TensorArg<'_>,
        v: TensorArg<'_>,
        o: TensorArg<'_>,
        lse: Option<TensorArg<'_>>,
        extras: Option<&Bound<'_, PyDict>>,
        device: usize,
    ) -> PyResult<()> {
        let x = Extras::from_py(&self.spec, extras, None)?;
        let p = x.params();
        let lse = lse.map(|l| tensor("lse", &l)).transpose()?;
        let (q, k, v, o) = (tensor("q", &q)?, tensor("k", &k)?, tensor("v", &v)?, tensor("o", &o)?);
        let descs = LaunchDescs {
            q: q.desc(),
            k: k.desc(),
            v: v.desc(),
            o: o.desc(),
            lse: lse.as_ref().map(|l| l.desc()),
            cu_seqlens_q: p.cu_seqlens_q.map(|t| t.host_index()),
            cu_seqlens_k: p.cu_seqlens_k.map(|t| t.host_index()),
            block_table: p.block_table.map(|t| t.host_index()),
            seqused_k: p.seqused_k.map(|t| t.host_index()),
            sinks: p.sinks.map(|t| t.desc()),
            aux: p.aux.iter().map(|(n, t)| (n.clone(), t.desc())).collect(),
            params: p.values.clone(),
            num_splits: p.num_splits,
            positions: p.positions,
            sequence_positions: p.sequence_positions.map(|(t, _)| t.host_index()),
        };
        // Tile sizes only shape grids and splits, which this check does not report.
        let shape =
            KernelShape { block_m: 128, block_n: 128, combine: CombineKind::None, ctas_per_sm: 1, persistent: false };
        plan(&self.spec, &shape, 132, device, &descs).map(|_| ()).map_err(validation_err)
    }
}

/// Parses `.attn` text. A mistake raises `attnc.AttncSyntaxError` with the file, line,
/// column, source line and caret.
#[pyfunction]
fn parse(py: Python<'_>, source: &str, file: &str) -> PyResult<Variant> {
    match attnc_dsl::parse_named(file, source) {
        Ok(spec) => Ok(Variant { spec }),
        Err(diags) => {
            let first = diags.iter().next();
            let (line, col, message, source_line) = first
                .map(|d| (d.line, d.col, d.message.clone(), d.source_line.clone()))
                .unwrap_or((0, 0, "invalid variant".into(), String::new()));
            let class = py.import("attnc.errors")?.getattr("AttncSyntaxError")?;
            let exc = class.call1((diags.to_string(), file, line, col, message, source_line))?;
            Err(PyErr::from_value(exc))
        }
    }
}

/// One runtime per device, for the process (modules and workspaces are per runtime).
fn runtime(device: usize) -> PyResult<Runtime> {
    static RUNTIMES: OnceLock<Mutex<HashMap<usize, Runtime>>> = OnceLock::new();
    let map = RUNTIMES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut g = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = g.get(&device) {
        return Ok(rt.clone());
    }
    let rt = Runtime::new(device).map_err(py_err)?;
    g.insert(device, rt.clone());
    Ok(rt)
}

/// A variant's tile classification for one launch configuration (shapes, params, aux
/// tensors), built once and passed to every forward that shares it.
#[pyclass(frozen, weakref, module = "attnc._attnc")]
struct BlockMask {
    inner: attnc_runtime::BlockMask,
}

#[pymethods]
impl BlockMask {
    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// A variant compiled for one device: launches on caller-owned tensors.
#[pyclass(frozen, module = "attnc._attnc")]
struct Kernel {
    /// The kernel launches use: the dispatcher's, or an interim one while that compiles.
    current: RwLock<Arc<attnc_runtime::Kernel>>,
    /// Ready first (`Runtime::kernel_ready_first`): the dispatcher's kernel compiling on a
    /// thread; `waiting` says so without taking the lock on every call.
    pending: Mutex<Option<PendingKernel>>,
    waiting: AtomicBool,
    /// The last launch's receipt (shared with the runtime's launch memo on repeats).
    last: Mutex<Option<Arc<Receipt>>>,
}

impl Kernel {
    fn new(kernel: attnc_runtime::Kernel, pending: Option<PendingKernel>) -> Kernel {
        Kernel {
            current: RwLock::new(Arc::new(kernel)),
            waiting: AtomicBool::new(pending.is_some()),
            pending: Mutex::new(pending),
            last: Mutex::new(None),
        }
    }

    /// The kernel for this call: the dispatcher's as soon as its compile has finished.
    fn kernel(&self) -> Arc<attnc_runtime::Kernel> {
        if self.waiting.load(Ordering::Acquire) {
            self.take_pending(false);
        }
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Swaps in the dispatcher's kernel when it is ready (or, with `block`, once it is).
    /// If it failed to build, the interim kernel stays and its receipts say why.
    fn take_pending(&self, block: bool) {
        // Without `block`, a call that finds another thread in `wait_ready` runs on the
        // current kernel instead of queueing behind it.
        let mut slot = match block {
            true => self.pending.lock().unwrap_or_else(|e| e.into_inner()),
            false => match self.pending.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            },
        };
        let Some(pending) = slot.as_ref() else { return };
        let done = match block {
            true => Some(pending.wait()),
            false => pending.poll(),
        };
        let Some(done) = done else { return };
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current =
            match done {
                Ok(k) => Arc::new(k),
                Err(e) => Arc::new(current.with_interim_reason(format!(
                    "portable runs: the {} module failed to build: {e}",
                    pending.family()
                ))),
            };
        *slot = None;
        self.waiting.store(false, Ordering::Release);
    }

    fn remember(&self, r: impl Into<Arc<Receipt>>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(r.into());
    }
}

#[pymethods]
impl Kernel {
    /// O (and LSE when given) from Q, K, V, queued on `stream` (a `CUstream` handle).
    #[pyo3(signature = (q, k, v, o, lse, stream, extras = None))]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        q: TensorArg<'_>,
        k: TensorArg<'_>,
        v: TensorArg<'_>,
        o: TensorArg<'_>,
        lse: Option<TensorArg<'_>>,
        stream: usize,
        extras: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let kernel = self.kernel();
        let x = Extras::from_py(kernel.spec(), extras, Some(stream))?;
        let (q, k, v, mut o) = (tensor("q", &q)?, tensor("k", &k)?, tensor("v", &v)?, tensor("o", &o)?);
        let p = x.params();
        let r = match lse {
            Some(l) => {
                let mut l = tensor("lse", &l)?;
                kernel.forward_lse(&q, &k, &v, &mut o, &mut l, &p)
            }
            None => kernel.forward(&q, &k, &v, &mut o, &p),
        }
        .map_err(py_err)?;
        self.remember(r);
        Ok(())
    }

    /// The forward of torch tensors with its outputs allocated like Q's (`q.new_empty`,
    /// PyTorch's caching allocator on Q's device): `(o, lse)`, `lse` None unless
    /// `need_lse`. The eager path of `attnc.torch`: one call from Python per forward.
    #[pyo3(signature = (q, k, v, stream, need_lse, extras = None))]
    #[allow(clippy::too_many_arguments)]
    fn forward_torch<'py>(
        &self,
        q: &Bound<'py, PyAny>,
        k: TensorArg<'_>,
        v: TensorArg<'_>,
        stream: usize,
        need_lse: bool,
        extras: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
        let kernel = self.kernel();
        let py = q.py();
        let x = Extras::from_py(kernel.spec(), extras, Some(stream))?;
        let (tq, tk, tv) = (torch_tensor("q", q)?, tensor("k", &k)?, tensor("v", &v)?);
        let spec = kernel.spec();
        let (o_shape, lse_shape) = output_shapes(spec, tq.shape());
        let new_empty = intern!(py, "new_empty");
        // O like Q (torch.empty_like: no size list to parse) where their shapes agree.
        let o = if o_shape.as_slice() == tq.shape() {
            torch_empty_like(py)?.bind(py).call1((q,))?
        } else {
            q.call_method1(new_empty, (PyTuple::new(py, &o_shape)?,))?
        };
        let mut to = fresh_view("o", &o, tq.dtype(), &o_shape, tq.device())?;
        let p = x.params();
        let (r, lse) = if need_lse {
            let dtype = &torch_dtypes(py)?[2];
            let kwargs = PyDict::new(py);
            kwargs.set_item(intern!(py, "dtype"), dtype.bind(py))?;
            let lse = q.call_method(intern!(py, "new_empty"), (PyTuple::new(py, &lse_shape)?,), Some(&kwargs))?;
            let mut tl = fresh_view("lse", &lse, ElemType::F32, &lse_shape, tq.device())?;
            (kernel.forward_shared(&tq, &tk, &tv, &mut to, Some(&mut tl), &p), Some(lse))
        } else {
            (kernel.forward_shared(&tq, &tk, &tv, &mut to, None, &p), None)
        };
        self.remember(r.map_err(py_err)?);
        Ok((o, lse))
    }

    /// dQ, dK, dV (and dsinks / aux gradients through `extras`) from the forward's
    /// inputs, its O and LSE, and dO, queued on `stream`.
    #[pyo3(signature = (q, k, v, o, lse, d_out, dq, dk, dv, stream, extras = None))]
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        q: TensorArg<'_>,
        k: TensorArg<'_>,
        v: TensorArg<'_>,
        o: TensorArg<'_>,
        lse: TensorArg<'_>,
        d_out: TensorArg<'_>,
        dq: TensorArg<'_>,
        dk: TensorArg<'_>,
        dv: TensorArg<'_>,
        stream: usize,
        extras: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let kernel = self.kernel();
        let x = Extras::from_py(kernel.spec(), extras, Some(stream))?;
        let (q, k, v, o) = (tensor("q", &q)?, tensor("k", &k)?, tensor("v", &v)?, tensor("o", &o)?);
        let (lse, d_out) = (tensor("lse", &lse)?, tensor("d_out", &d_out)?);
        let (mut dq, mut dk, mut dv) = (tensor("dq", &dq)?, tensor("dk", &dk)?, tensor("dv", &dv)?);
        let p = x.params();
        let grads = Gradients { dq: &mut dq, dk: &mut dk, dv: &mut dv };
        let r = kernel.backward(&q, &k, &v, &o, &lse, &d_out, grads, &p).map_err(py_err)?;
        self.remember(r);
        Ok(())
    }

    /// Classifies the tiles of a mask over aux tensors for these arguments once (queued on
    /// `stream`), for every forward with the same shapes, params and aux tensors.
    #[pyo3(signature = (q, k, v, o, stream, extras = None))]
    #[allow(clippy::too_many_arguments)]
    fn block_mask(
        &self,
        q: TensorArg<'_>,
        k: TensorArg<'_>,
        v: TensorArg<'_>,
        o: TensorArg<'_>,
        stream: usize,
        extras: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<BlockMask> {
        let kernel = self.kernel();
        let x = Extras::from_py(kernel.spec(), extras, Some(stream))?;
        let (q, k, v, o) = (tensor("q", &q)?, tensor("k", &k)?, tensor("v", &v)?, tensor("o", &o)?);
        let inner = kernel.block_mask(&q, &k, &v, &o, &x.params()).map_err(py_err)?;
        Ok(BlockMask { inner })
    }

    /// The last launch's receipt as JSON (None before the first launch).
    fn receipt_json(&self) -> PyResult<Option<String>> {
        let g = self.last.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|r| serde_json::to_string(&**r).map_err(|e| PyRuntimeError::new_err(e.to_string()))).transpose()
    }

    /// The last launch's receipt as text (what `attnc` prints).
    fn receipt_text(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|r| r.to_string())
    }

    #[getter]
    fn family(&self) -> String {
        let kernel = self.kernel();
        kernel.family().to_string()
    }

    /// Whether launches run on an interim (portable) kernel while the dispatcher's
    /// compiles (`ready_first`).
    #[getter]
    fn is_interim(&self) -> bool {
        self.kernel().is_interim()
    }

    /// Blocks until the dispatcher's kernel has compiled and serves the launches (at once
    /// when there is nothing pending).
    fn wait_ready(&self, py: Python<'_>) {
        py.detach(|| self.take_pending(true))
    }

    #[getter]
    fn fallback_reason(&self) -> Option<String> {
        let kernel = self.kernel();
        kernel.fallback_reason().map(str::to_string)
    }
}

/// The kernel of `variant` on CUDA device `device` (compiled once, then cached in memory
/// and on disk). `family`: auto, portable, hopper or blackwell. `ready_first` (with
/// `auto`): when the dispatcher's module is not cached, launches run on a portable kernel
/// (compiled in a fraction of the time; receipts say so) until it has compiled on a thread.
#[pyfunction]
#[pyo3(signature = (variant, device = 0, family = "auto", ready_first = false))]
fn kernel(py: Python<'_>, variant: &Variant, device: usize, family: &str, ready_first: bool) -> PyResult<Kernel> {
    let family: FamilyChoice = family.parse().map_err(PyValueError::new_err)?;
    let spec = variant.spec.clone();
    let (k, pending) = py.detach(move || {
        runtime(device).and_then(|rt| match (ready_first, family) {
            (true, FamilyChoice::Auto) => rt.kernel_ready_first(&spec).map_err(py_err),
            _ => rt.kernel_with(&spec, family).map(|k| (k, None)).map_err(py_err),
        })
    })?;
    Ok(Kernel::new(k, pending))
}

/// The cache of device `device`'s runtime: counters and the disk directory.
#[pyfunction]
#[pyo3(signature = (device = 0))]
fn cache_info(py: Python<'_>, device: usize) -> PyResult<Py<PyDict>> {
    let rt = runtime(device)?;
    let s = rt.cache_stats();
    let d = PyDict::new(py);
    d.set_item("memory_hits", s.memory_hits)?;
    d.set_item("disk_hits", s.disk_hits)?;
    d.set_item("builds", s.builds)?;
    d.set_item("discarded", s.discarded)?;
    d.set_item("write_errors", s.write_errors)?;
    d.set_item("dir", rt.cache_dir().map(|p| p.display().to_string()))?;
    d.set_item("warning", rt.cache_warning())?;
    d.set_item("device", rt.device().name.clone())?;
    d.set_item("arch", rt.device().arch.clone())?;
    Ok(d.unbind())
}

/// Is a CUDA driver loadable here?
#[pyfunction]
fn driver_present() -> bool {
    attnc_runtime::driver_present()
}

/// The layout name of a variant's KV cache (for the Python side's shape rules).
#[pyfunction]
fn kv_layout(variant: &Variant) -> &'static str {
    match variant.spec.kv_layout {
        KvLayout::Contiguous => "contiguous",
        KvLayout::Varlen => "varlen",
        KvLayout::Paged { .. } => "paged",
    }
}

#[pymodule]
fn _attnc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Variant>()?;
    m.add_class::<Kernel>()?;
    m.add_class::<BlockMask>()?;
    m.add_function(wrap_pyfunction!(parse, m)?)?;
    m.add_function(wrap_pyfunction!(kernel, m)?)?;
    m.add_function(wrap_pyfunction!(cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(kv_layout, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
