//! Writes a `.pte` with one large 4-bit XNNPACK filter, without ExecuTorch, for the
//! benchmark of dequantized reads and re-quantizing writes (scripts/bench-xnnpack).
//!
//! The file is laid out as ExecuTorch lays out an 8da4w Linear (the fixture
//! `tests/fixtures/extra/xnn_qb4_linear.pte`, grown): an `eh00` header, a Program whose plan
//! `forward` calls one `XnnpackBackend` delegate, its payload (`XH00` header and an
//! `XNNGraph`: `XNNConvert` of the input to `qdint8`, then `XNNFullyConnected` with a `qbint4`
//! filter `[out, in]`, group size 32, bfloat16 scales) in segment 1, and the filter's bytes and
//! scales as named data `"weight"` and `"scale_weight"` in segments 2 and 3. The nibbles and
//! scales are deterministic pseudo-random values.
//!
//! ```text
//! cargo run --release --example make_xnnpack_model -- OUT.pte [--out-features 4096] [--in-features 4096]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use ptefs::backend::xnnpack::header::payload_with_header;
use ptefs::format::generated::{pte_fb, xnn_fb};
use ptefs::format::writer::{pack_program, place_segments, pte_program_region};

const GROUP: u32 = 32;
const SEGMENT_ALIGNMENT: u64 = 128;
const TENSOR_ALIGNMENT: u64 = 16;

#[derive(Parser)]
#[command(about = "Write a .pte with one large qbint4 XNNPACK filter (no ExecuTorch needed)")]
struct Args {
    /// Output .pte path.
    out: PathBuf,
    #[arg(long, default_value_t = 4096)]
    out_features: u32,
    /// A multiple of 32 (the group size).
    #[arg(long, default_value_t = 4096)]
    in_features: u32,
}

fn tensor(id: u32, datatype: xnn_fb::XNNDatatype, dims: &[u32]) -> xnn_fb::XNNTensorValueT {
    let mut t = xnn_fb::XNNTensorValueT::default();
    t.datatype = datatype;
    t.num_dims = dims.len() as u32;
    t.dims = Some(dims.to_vec());
    t.external_id = u32::MAX;
    t.id_out = id;
    t
}

fn value(union: xnn_fb::XValueUnionT) -> xnn_fb::XValueT {
    let mut v = xnn_fb::XValueT::default();
    v.xvalue_union = union;
    v
}

fn node(union: xnn_fb::XNodeUnionT) -> xnn_fb::XNodeT {
    let mut n = xnn_fb::XNodeT::default();
    n.xnode_union = union;
    n
}

fn named(key: &str, size: u64) -> xnn_fb::ConstantDataOffsetT {
    let mut c = xnn_fb::ConstantDataOffsetT::default();
    c.offset = u64::MAX;
    c.size = size;
    c.named_key = Some(key.to_string());
    c
}

/// The payload: `XH00` header, then the graph (no constant region: every constant is named
/// data, as in ExecuTorch's exports).
fn payload(rows: u32, cols: u32, weight_bytes: u64, scale_bytes: u64) -> Vec<u8> {
    use xnn_fb::XNNDatatype as D;
    let mut input = tensor(0, D::xnn_datatype_fp32, &[1, cols]);
    (input.flags, input.external_id) = (1, 0);
    let mut dynamic = xnn_fb::XNNQuantizedTensorValueT::default();
    dynamic.tensor_value = Some(Box::new(tensor(1, D::xnn_datatype_qdint8, &[1, cols])));
    let mut per_token = xnn_fb::PerTokenDynamicQuantT::default();
    per_token.num_nonbatch_dims = 1;
    dynamic.quant_params = xnn_fb::XNNQuantParamsT::PerTokenDynamicQuant(Box::new(per_token));
    let mut filter = xnn_fb::XNNQuantizedTensorValueT::default();
    let mut f = tensor(2, D::xnn_datatype_qbint4, &[rows, cols]);
    f.constant_buffer_idx = 1;
    filter.tensor_value = Some(Box::new(f));
    let mut group = xnn_fb::PerChannelGroupQuantT::default();
    group.group_size = GROUP as i32;
    group.scale_buffer_idx = 2;
    group.num_scales = rows * (cols / GROUP);
    filter.quant_params = xnn_fb::XNNQuantParamsT::PerChannelGroupQuant(Box::new(group));
    let mut output = tensor(3, D::xnn_datatype_fp32, &[1, rows]);
    (output.flags, output.external_id) = (2, 1);

    let mut convert = xnn_fb::_XNNNode1x1T::default();
    (convert.input_id, convert.output_id) = (0, 1);
    let mut fc = xnn_fb::XNNFullyConnectedT::default();
    (fc.input1_id, fc.filter_id, fc.bias_id, fc.output_id) = (1, 2, u32::MAX, 3);

    let mut g = xnn_fb::XNNGraphT::default();
    g.version = Some("0".into());
    g.xnodes = Some(vec![
        node(xnn_fb::XNodeUnionT::XNNConvert(Box::new(convert))),
        node(xnn_fb::XNodeUnionT::XNNFullyConnected(Box::new(fc))),
    ]);
    g.xvalues = Some(vec![
        value(xnn_fb::XValueUnionT::XNNTensorValue(Box::new(input))),
        value(xnn_fb::XValueUnionT::XNNQuantizedTensorValue(Box::new(
            dynamic,
        ))),
        value(xnn_fb::XValueUnionT::XNNQuantizedTensorValue(Box::new(
            filter,
        ))),
        value(xnn_fb::XValueUnionT::XNNTensorValue(Box::new(output))),
    ]);
    g.num_externs = 2;
    g.input_ids = Some(vec![0]);
    g.output_ids = Some(vec![3]);
    let mut empty = xnn_fb::ConstantDataOffsetT::default();
    empty.named_key = Some(String::new());
    g.constant_data = Some(vec![
        empty,
        named("weight", weight_bytes),
        named("scale_weight", scale_bytes),
    ]);
    let mut b = flatbuffers::FlatBufferBuilder::new();
    let root = g.pack(&mut b);
    b.finish(root, Some("XN01"));
    payload_with_header(b.finished_data(), &[]).expect("a small payload fits XH00")
}

fn fp32_tensor(sizes: &[i32]) -> pte_fb::EValueT {
    let mut t = pte_fb::TensorT::default();
    t.scalar_type = pte_fb::ScalarType::FLOAT;
    t.sizes = Some(sizes.to_vec());
    t.dim_order = Some((0..sizes.len() as u8).collect());
    let mut v = pte_fb::EValueT::default();
    v.val = pte_fb::KernelTypesT::Tensor(Box::new(t));
    v
}

/// Deterministic pseudo-random bytes (splitmix64).
fn noise(len: usize, mut state: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn run(args: &Args) -> Result<(), String> {
    let (rows, cols) = (args.out_features, args.in_features);
    if rows == 0 || cols == 0 || cols % GROUP != 0 {
        return Err(format!(
            "--in-features must be a positive multiple of {GROUP} and --out-features positive"
        ));
    }
    let weight = noise((u64::from(rows) * u64::from(cols) / 2) as usize, 1);
    // bfloat16 scales between 2^-8 and 2^-6: positive normal, as XNNPACK requires.
    let n_scales = (u64::from(rows) * u64::from(cols / GROUP)) as usize;
    let scales: Vec<u8> = noise(n_scales, 2)
        .iter()
        .flat_map(|&r| {
            let bits = (0x3b80u16 + u16::from(r)).to_le_bytes();
            bits.into_iter()
        })
        .collect();
    let payload = payload(rows, cols, weight.len() as u64, scales.len() as u64);
    let sizes = [
        0,
        payload.len() as u64,
        weight.len() as u64,
        scales.len() as u64,
    ];
    let offsets = place_segments(&sizes, &[0, 1, 2, 3], SEGMENT_ALIGNMENT)
        .ok_or("segment offsets overflow")?;

    let mut call = pte_fb::DelegateCallT::default();
    call.delegate_index = 0;
    call.args = Some(vec![0, 1]);
    let mut instruction = pte_fb::InstructionT::default();
    instruction.instr_args = pte_fb::InstructionArgumentsT::DelegateCall(Box::new(call));
    let mut chain = pte_fb::ChainT::default();
    chain.inputs = Some(vec![0]);
    chain.outputs = Some(vec![1]);
    chain.instructions = Some(vec![instruction]);
    let mut processed = pte_fb::BackendDelegateDataReferenceT::default();
    processed.location = pte_fb::DataLocation::SEGMENT;
    processed.index = 1;
    let mut delegate = pte_fb::BackendDelegateT::default();
    delegate.id = Some("XnnpackBackend".into());
    delegate.processed = Some(Box::new(processed));
    delegate.compile_specs = Some(vec![]);
    let mut plan = pte_fb::ExecutionPlanT::default();
    plan.name = Some("forward".into());
    plan.values = Some(vec![
        fp32_tensor(&[1, cols as i32]),
        fp32_tensor(&[1, rows as i32]),
    ]);
    plan.inputs = Some(vec![0]);
    plan.outputs = Some(vec![1]);
    plan.chains = Some(vec![chain]);
    plan.operators = Some(vec![]);
    plan.delegates = Some(vec![delegate]);
    plan.non_const_buffer_sizes = Some(vec![0]);

    let mut program = pte_fb::ProgramT::default();
    program.execution_plan = Some(vec![plan]);
    program.constant_buffer = Some(vec![]);
    program.backend_delegate_data = Some(vec![]);
    program.segments = Some(
        offsets
            .iter()
            .zip(sizes)
            .map(|(&offset, size)| {
                let mut s = pte_fb::DataSegmentT::default();
                (s.offset, s.size) = (offset, size);
                s
            })
            .collect(),
    );
    let mut constant = pte_fb::SubsegmentOffsetsT::default();
    constant.offsets = Some(vec![0]);
    program.constant_segment = Some(Box::new(constant));
    program.named_data = Some(
        [("weight", 2), ("scale_weight", 3)]
            .into_iter()
            .map(|(key, segment)| {
                let mut nd = pte_fb::NamedDataT::default();
                nd.key = Some(key.into());
                nd.segment_index = segment;
                nd
            })
            .collect(),
    );

    let data_size = offsets[3] + sizes[3];
    let fb = pack_program(&program, TENSOR_ALIGNMENT);
    let (mut file, base) =
        pte_program_region(&fb, TENSOR_ALIGNMENT, SEGMENT_ALIGNMENT, data_size, true);
    file.resize((base + data_size) as usize, 0);
    for (k, bytes) in [(1, &payload), (2, &weight), (3, &scales)] {
        let at = (base + offsets[k]) as usize;
        file[at..at + bytes.len()].copy_from_slice(bytes);
    }
    std::fs::write(&args.out, &file).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!(
        "{}: {} bytes; qbint4 filter [{rows}, {cols}] ({} bytes, {} bf16 scales), float32 view {} bytes",
        args.out.display(),
        file.len(),
        weight.len(),
        n_scales,
        u64::from(rows) * u64::from(cols) * 4
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_xnnpack_model: {e}");
            ExitCode::FAILURE
        }
    }
}
