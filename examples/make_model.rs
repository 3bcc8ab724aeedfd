//! Writes a large, realistic `.pte` without ExecuTorch, for benchmarks and manual tests.
//!
//! The file looks like what `serialize_pte_binary` produces for an exported model: an `eh00`
//! header, a Program with one plan `forward`, and one constant segment (segment 0) holding
//! every constant tensor, each 16-aligned, `offsets[0] = 0` the placeholder. Value 0 is a big
//! FLOAT tensor, value 1 a second FLOAT tensor, a few activations (memory-planned, no bytes in
//! the file) carry the plan's inputs and outputs, some values are `Int`s, and the remaining
//! constant bytes are spread over many small weight and bias tensors of mixed dtypes. With
//! `--blob N` the Program also gets a named-data blob (`named_data = [{key: "blob",
//! segment_index: 1}]`) in a second segment, which can be resized through the mount.
//!
//! With `--shared N`, N more values follow, each a copy of value 1: N tensors on one
//! constant buffer, as ExecuTorch's deduplication of equal bytes makes them (a 1 MB file with
//! 20,000 sharers: `--total 1M --big 4K --second 16 --values 12 --shared 20000`).
//!
//! Tensor bytes are deterministic pseudo-random numbers (finite, small floats for float
//! dtypes) and are streamed to the file, so a 1 GiB model needs a few MiB of memory.
//!
//! ```text
//! cargo run --release --example make_model -- OUT.pte --total 1G --values 12000 \
//!     --big 256M --second 64M [--blob 1M] [--shared N]
//! ```

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};

use ptefs::format::generated::pte_fb;
use ptefs::format::writer::{pack_program, place_segments, pte_program_region};

/// Alignment of constants inside the constant segment (ExecuTorch's default).
const TENSOR_ALIGNMENT: u64 = 16;
/// Alignment of segments relative to the segment base (ExecuTorch's default).
const SEGMENT_ALIGNMENT: u64 = 128;
/// Memory-planned activations at the start of the value table, after the two big tensors.
const ACTIVATIONS: usize = 8;
/// Width of the activations.
const HIDDEN: i32 = 4096;

#[derive(Parser)]
#[command(about = "Write a large synthetic ExecuTorch .pte (no ExecuTorch needed)")]
struct Args {
    /// Output .pte path.
    out: PathBuf,
    /// Total constant tensor bytes (suffixes K, M, G = powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    total: u64,
    /// Number of values in the plan "forward".
    #[arg(long, default_value_t = 12000)]
    values: usize,
    /// Bytes of the big FLOAT tensor (value 0).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    big: u64,
    /// Bytes of the second FLOAT tensor (value 1).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    second: u64,
    /// Bytes of a named-data blob "blob" in segment 1 (0 = no named data).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    blob: u64,
    /// Seed of the pseudo-random contents and shapes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Values added after the others, each a tensor on the constant buffer of value 1.
    #[arg(long, default_value_t = 0)]
    shared: usize,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in {s:?} (use K, M, G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|e| format!("bad size {s:?}: {e}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// proptest's XorShift generator seeded with `seed`: the same numbers for the same seed on
/// every machine, and fast enough to fill a GiB of filler bytes.
struct Rng(TestRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        // XorShift needs a seed that is not all zeros.
        bytes[8..].copy_from_slice(&(!seed).to_le_bytes());
        Rng(TestRng::from_seed(RngAlgorithm::XorShift, &bytes))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// A constant tensor of the plan: where it sits in the value table and its bytes.
struct Constant {
    value: usize,
    dtype: pte_fb::ScalarType,
    sizes: Vec<i32>,
    nbytes: u64,
}

fn element_size(t: pte_fb::ScalarType) -> u64 {
    match t {
        pte_fb::ScalarType::FLOAT | pte_fb::ScalarType::INT => 4,
        pte_fb::ScalarType::HALF | pte_fb::ScalarType::BFLOAT16 => 2,
        pte_fb::ScalarType::LONG => 8,
        _ => 1,
    }
}

/// A 2-D shape `[n / cols, cols]` when it divides, else 1-D.
fn shape_of(nelem: u64, cols: u64) -> Vec<i32> {
    if nelem >= cols && nelem % cols == 0 && nelem / cols <= i32::MAX as u64 {
        vec![(nelem / cols) as i32, cols as i32]
    } else {
        vec![i32::try_from(nelem).expect("tensor too large for i32 sizes")]
    }
}

fn tensor(dtype: pte_fb::ScalarType, sizes: Vec<i32>, buffer: u32) -> pte_fb::TensorT {
    let mut t = pte_fb::TensorT::default();
    t.scalar_type = dtype;
    t.dim_order = Some((0..sizes.len() as u8).collect());
    t.sizes = Some(sizes);
    t.data_buffer_idx = buffer;
    t.shape_dynamism = pte_fb::TensorShapeDynamism::STATIC;
    t
}

fn evalue(val: pte_fb::KernelTypesT) -> pte_fb::EValueT {
    let mut e = pte_fb::EValueT::default();
    e.val = val;
    e
}

fn operator(name: &str, overload: &str) -> pte_fb::OperatorT {
    let mut o = pte_fb::OperatorT::default();
    o.name = Some(name.to_string());
    o.overload = Some(overload.to_string());
    o
}

fn kernel_call(op_index: i32, args: Vec<i32>) -> pte_fb::InstructionT {
    let mut k = pte_fb::KernelCallT::default();
    k.op_index = op_index;
    k.args = Some(args);
    let mut i = pte_fb::InstructionT::default();
    i.instr_args = pte_fb::InstructionArgumentsT::KernelCall(Box::new(k));
    i
}

/// Fills `buf` with deterministic contents for a tensor of `dtype`: small finite numbers for
/// floating-point types, small integers for integer types.
fn fill(buf: &mut [u8], dtype: pte_fb::ScalarType, rng: &mut Rng) {
    match dtype {
        pte_fb::ScalarType::FLOAT => {
            for c in buf.chunks_exact_mut(8) {
                let r = rng.next();
                // Two floats in [-0.5, 0.5): random mantissa on 1.0, minus 1.5.
                let a = f32::from_bits(0x3F80_0000 | (r as u32 & 0x007F_FFFF)) - 1.5;
                let b = f32::from_bits(0x3F80_0000 | ((r >> 32) as u32 & 0x007F_FFFF)) - 1.5;
                c[..4].copy_from_slice(&a.to_le_bytes());
                c[4..].copy_from_slice(&b.to_le_bytes());
            }
        }
        pte_fb::ScalarType::HALF => {
            for c in buf.chunks_exact_mut(8) {
                let r = rng.next();
                for (j, h) in c.chunks_exact_mut(2).enumerate() {
                    // sign, exponent 2^-4, random mantissa: |x| in [0.0625, 0.125).
                    let bits = ((r >> (16 * j)) as u16 & 0x83FF) | 0x2C00;
                    h.copy_from_slice(&bits.to_le_bytes());
                }
            }
        }
        pte_fb::ScalarType::BFLOAT16 => {
            for c in buf.chunks_exact_mut(8) {
                let r = rng.next();
                for (j, h) in c.chunks_exact_mut(2).enumerate() {
                    // sign, exponent 2^-4, random mantissa.
                    let bits = ((r >> (16 * j)) as u16 & 0x807F) | 0x3D80;
                    h.copy_from_slice(&bits.to_le_bytes());
                }
            }
        }
        pte_fb::ScalarType::LONG => {
            for c in buf.chunks_exact_mut(8) {
                let v = (rng.next() % 32000) as i64;
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            for c in buf.chunks_exact_mut(8) {
                c.copy_from_slice(&rng.next().to_le_bytes());
            }
        }
    }
    // Tails shorter than 8 bytes (buffers are 8-byte multiples except the last piece).
    let tail = buf.len() / 8 * 8;
    for b in &mut buf[tail..] {
        *b = rng.next() as u8;
    }
}

/// Streams `n` bytes of tensor contents to `out`.
fn write_tensor(
    out: &mut impl Write, dtype: pte_fb::ScalarType, n: u64, seed: u64, chunk: &mut [u8],
) -> std::io::Result<()> {
    let mut rng = Rng::new(seed);
    let mut left = n;
    while left > 0 {
        let len = left.min(chunk.len() as u64) as usize;
        fill(&mut chunk[..len], dtype, &mut rng);
        out.write_all(&chunk[..len])?;
        left -= len as u64;
    }
    Ok(())
}

fn write_zeros(out: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    let zeros = [0u8; 4096];
    while n > 0 {
        let len = n.min(zeros.len() as u64) as usize;
        out.write_all(&zeros[..len])?;
        n -= len as u64;
    }
    Ok(())
}

/// Chooses the value table: which values are constants (with their shapes), activations and
/// Ints, so that the constants hold exactly `args.total` bytes.
fn plan_values(args: &Args, rng: &mut Rng) -> Result<(Vec<Constant>, Vec<usize>), String> {
    let fixed = 2 + ACTIVATIONS;
    if args.values < fixed + 2 {
        return Err(format!("--values must be at least {}", fixed + 2));
    }
    if args.big % 4 != 0 || args.second % 4 != 0 || args.big == 0 || args.second == 0 {
        return Err("--big and --second must be positive multiples of 4 (FLOAT)".into());
    }
    let rest = args
        .total
        .checked_sub(args.big + args.second)
        .ok_or("--total is smaller than --big + --second")?;

    let mut constants = vec![
        Constant {
            value: 0,
            dtype: pte_fb::ScalarType::FLOAT,
            sizes: shape_of(args.big / 4, HIDDEN as u64),
            nbytes: args.big,
        },
        Constant {
            value: 1,
            dtype: pte_fb::ScalarType::FLOAT,
            sizes: shape_of(args.second / 4, HIDDEN as u64),
            nbytes: args.second,
        },
    ];
    // Values after the activations: every 16th is an Int, the others small constants.
    let mut ints = Vec::new();
    let mut small = Vec::new();
    for v in fixed..args.values {
        if (v - fixed) % 16 == 15 {
            ints.push(v);
        } else {
            small.push(v);
        }
    }
    if rest == 0 {
        // Nothing left to spread: the remaining values are Ints.
        ints.append(&mut small);
        ints.sort_unstable();
        return Ok((constants, ints));
    }
    // The last small constant is a 1-D byte tensor taking the exact remainder.
    let last = small.pop().expect("at least one small value");
    // Even positions are weights, odd positions the biases of the weight before them. Keep
    // at least 1 KiB (or what is there) for the remainder tensor. Column counts are chosen
    // so that biases take at most about 1/8 of the bytes of their pair.
    let reserve = 1024.min(rest);
    let pairs = small.len().div_ceil(2) as u64;
    let per_pair = (rest - reserve) / pairs.max(1);
    const COLS: [u64; 6] = [256, 512, 768, 1024, 2048, 4096];
    let allowed: Vec<u64> = COLS
        .iter()
        .copied()
        .filter(|c| c * 4 * 8 <= per_pair)
        .collect();
    let fallback = (per_pair / 32).max(1);
    let mut cols = Vec::with_capacity(small.len());
    let mut bias_bytes = 0u64;
    for i in 0..small.len() {
        if i % 2 == 0 {
            cols.push(if allowed.is_empty() {
                fallback
            } else {
                allowed[rng.below(allowed.len() as u64) as usize]
            });
        } else {
            let c = cols[i - 1];
            cols.push(c);
            bias_bytes += c * 4;
        }
    }
    let weights_budget = rest.saturating_sub(bias_bytes + reserve);
    let mut dtypes = Vec::with_capacity(small.len());
    let mut jitter = Vec::with_capacity(small.len());
    let mut jitter_sum = 0u64;
    for i in 0..small.len() {
        if i % 2 == 0 {
            let d = match rng.below(20) {
                0..=11 => pte_fb::ScalarType::FLOAT,
                12..=15 => pte_fb::ScalarType::HALF,
                16..=18 => pte_fb::ScalarType::BFLOAT16,
                _ => pte_fb::ScalarType::LONG,
            };
            let j = 50 + rng.below(101); // 0.5x .. 1.5x of the mean
            dtypes.push(d);
            jitter.push(j);
            jitter_sum += j;
        } else {
            dtypes.push(pte_fb::ScalarType::FLOAT);
            jitter.push(0);
        }
    }
    let mut used = 0u64;
    if bias_bytes + reserve > rest {
        // Too little for biases: all small values but the last become Ints.
        ints.extend(small.iter().copied());
        ints.sort_unstable();
    } else {
        for (i, &v) in small.iter().enumerate() {
            let (dtype, sizes, nbytes) = if i % 2 == 0 {
                let es = element_size(dtypes[i]);
                let target =
                    (weights_budget as u128 * jitter[i] as u128 / jitter_sum.max(1) as u128) as u64;
                let rows = target / (cols[i] * es);
                if rows == 0 {
                    // Narrower than one row: a 1-D tensor (at least one element).
                    let n = (target / es).max(1);
                    (dtypes[i], vec![n as i32], n * es)
                } else {
                    (
                        dtypes[i],
                        vec![rows as i32, cols[i] as i32],
                        rows * cols[i] * es,
                    )
                }
            } else {
                (pte_fb::ScalarType::FLOAT, vec![cols[i] as i32], cols[i] * 4)
            };
            if used + nbytes + reserve > rest {
                ints.push(v);
                continue;
            }
            used += nbytes;
            constants.push(Constant {
                value: v,
                dtype,
                sizes,
                nbytes,
            });
        }
    }
    let remainder = rest - used;
    constants.push(Constant {
        value: last,
        dtype: pte_fb::ScalarType::BYTE,
        sizes: vec![i32::try_from(remainder).map_err(|_| "remainder tensor too large")?],
        nbytes: remainder,
    });
    ints.sort_unstable();
    Ok((constants, ints))
}

fn run(args: &Args) -> Result<(), String> {
    let mut rng = Rng::new(args.seed);
    let (constants, ints) = plan_values(args, &mut rng)?;

    // Constant segment: offsets[0] = 0 placeholder, buffer k for constants[k-1].
    let mut offsets = vec![0u64];
    let mut cursor = 0u64;
    for (i, c) in constants.iter().enumerate() {
        offsets.push(cursor);
        cursor += c.nbytes;
        if i + 1 < constants.len() {
            cursor = align_up(cursor, TENSOR_ALIGNMENT);
        }
    }
    let constant_segment_size = cursor;
    let mut seg_sizes = vec![constant_segment_size];
    if args.blob > 0 {
        seg_sizes.push(args.blob);
    }
    let order: Vec<usize> = (0..seg_sizes.len()).collect();
    let seg_offsets =
        place_segments(&seg_sizes, &order, SEGMENT_ALIGNMENT).ok_or("segment offsets overflow")?;
    let segment_data_size = seg_offsets.last().unwrap() + seg_sizes.last().unwrap();

    // Value table.
    let mut values: Vec<Option<pte_fb::EValueT>> = (0..args.values).map(|_| None).collect();
    for (k, c) in constants.iter().enumerate() {
        let t = tensor(c.dtype, c.sizes.clone(), (k + 1) as u32);
        values[c.value] = Some(evalue(pte_fb::KernelTypesT::Tensor(Box::new(t))));
    }
    let act_bytes = HIDDEN as u64 * 4;
    for a in 0..ACTIVATIONS {
        let mut t = tensor(pte_fb::ScalarType::FLOAT, vec![1, HIDDEN], 0);
        let mut alloc = pte_fb::AllocationDetailsT::default();
        alloc.memory_id = 1;
        alloc.memory_offset_low = (a as u64 * act_bytes) as u32;
        t.allocation_info = Some(Box::new(alloc));
        values[2 + a] = Some(evalue(pte_fb::KernelTypesT::Tensor(Box::new(t))));
    }
    const INT_VALUES: [i64; 6] = [-1, 0, 1, 2, 4096, 1 << 20];
    for (j, &v) in ints.iter().enumerate() {
        let mut i = pte_fb::IntT::default();
        i.int_val = INT_VALUES[j % INT_VALUES.len()];
        values[v] = Some(evalue(pte_fb::KernelTypesT::Int(Box::new(i))));
    }
    let mut values: Vec<pte_fb::EValueT> = values
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or(format!("value {i} was not assigned")))
        .collect::<Result<_, _>>()?;
    let second = values[1].clone();
    values.extend(std::iter::repeat_n(second, args.shared));

    // Operators and a small chain: linear (big weight) -> relu -> linear (second weight) ->
    // add, then a few more linears over small weights.
    let operators = vec![
        operator("aten::linear", "out"),
        operator("aten::relu", "out"),
        operator("aten::add", "out"),
        operator("aten::mul", "out"),
        operator("aten::gelu", "out"),
    ];
    let input = 2i32;
    let output = 3i32;
    let act = |a: usize| (2 + a) as i32;
    let alpha = ints.first().map_or(input, |&v| v as i32);
    let mut instructions = vec![
        kernel_call(0, vec![input, 0, act(4), act(4)]),
        kernel_call(1, vec![act(4), act(5), act(5)]),
        kernel_call(0, vec![act(5), 1, act(6), act(6)]),
        kernel_call(2, vec![act(6), act(4), alpha, act(7), act(7)]),
    ];
    // Linears over the first small weights (value, bias) pairs, alternating two activations.
    let smalls: Vec<&Constant> = constants.iter().skip(2).collect();
    let mut cur = act(7);
    for (n, pair) in smalls.chunks(2).take(6).enumerate() {
        let dst = if n % 2 == 0 { act(4) } else { act(7) };
        let mut a = vec![cur, pair[0].value as i32];
        if let Some(b) = pair.get(1) {
            a.push(b.value as i32);
        }
        a.extend([dst, dst]);
        instructions.push(kernel_call(0, a));
        instructions.push(kernel_call(4, vec![dst, dst, dst]));
        cur = dst;
    }
    instructions.push(kernel_call(3, vec![cur, act(5), output, output]));

    let mut chain = pte_fb::ChainT::default();
    chain.inputs = Some(vec![input]);
    chain.outputs = Some(vec![output]);
    chain.instructions = Some(instructions);

    let mut meta = pte_fb::ContainerMetadataT::default();
    meta.encoded_inp_str = Some("T2#1#0(T1#1($),D0())".to_string());
    meta.encoded_out_str = Some("T1#1($)".to_string());

    let mut plan = pte_fb::ExecutionPlanT::default();
    plan.name = Some("forward".to_string());
    plan.container_meta_type = Some(Box::new(meta));
    plan.values = Some(values);
    plan.inputs = Some(vec![input]);
    plan.outputs = Some(vec![output]);
    plan.chains = Some(vec![chain]);
    plan.operators = Some(operators);
    plan.delegates = Some(vec![]);
    plan.non_const_buffer_sizes = Some(vec![0, (ACTIVATIONS as u64 * act_bytes) as i64]);

    let mut program = pte_fb::ProgramT::default();
    program.version = 0;
    program.execution_plan = Some(vec![plan]);
    program.constant_buffer = Some(vec![]);
    program.backend_delegate_data = Some(vec![]);
    program.segments = Some(
        seg_offsets
            .iter()
            .zip(&seg_sizes)
            .map(|(&offset, &size)| {
                let mut s = pte_fb::DataSegmentT::default();
                s.offset = offset;
                s.size = size;
                s
            })
            .collect(),
    );
    let mut cs = pte_fb::SubsegmentOffsetsT::default();
    cs.segment_index = 0;
    cs.offsets = Some(offsets);
    program.constant_segment = Some(Box::new(cs));
    if args.blob > 0 {
        let mut nd = pte_fb::NamedDataT::default();
        nd.key = Some("blob".to_string());
        nd.segment_index = 1;
        program.named_data = Some(vec![nd]);
    }

    let fb = pack_program(&program, TENSOR_ALIGNMENT);
    let (head, base) = pte_program_region(
        &fb,
        TENSOR_ALIGNMENT,
        SEGMENT_ALIGNMENT,
        segment_data_size,
        true,
    );

    // Stream: head, zeros to the base, constants with 16-byte padding, then the blob segment.
    let file = File::create(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let io = |e: std::io::Error| format!("{}: {e}", args.out.display());
    out.write_all(&head).map_err(io)?;
    write_zeros(&mut out, base - head.len() as u64).map_err(io)?;
    let mut chunk = vec![0u8; 1 << 20];
    let mut pos = 0u64; // relative to the segment base
    for (k, c) in constants.iter().enumerate() {
        let at = seg_offsets[0] + constant_segment_offset(&program, k + 1);
        write_zeros(&mut out, at - pos).map_err(io)?;
        let seed = args.seed.wrapping_mul(0x1000_0000_01B3) ^ (k as u64 + 1);
        write_tensor(&mut out, c.dtype, c.nbytes, seed, &mut chunk).map_err(io)?;
        pos = at + c.nbytes;
    }
    if args.blob > 0 {
        write_zeros(&mut out, seg_offsets[1] - pos).map_err(io)?;
        let seed = args.seed ^ 0xB10B;
        write_tensor(
            &mut out,
            pte_fb::ScalarType::BYTE,
            args.blob,
            seed,
            &mut chunk,
        )
        .map_err(io)?;
        pos = seg_offsets[1] + args.blob;
    }
    debug_assert_eq!(pos, segment_data_size);
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    let size = base + segment_data_size;

    eprintln!(
        "{}: {} bytes ({:.1} MiB); flatbuffer {} bytes, segment base {}; {} values ({} constant tensors, {} activations, {} Ints, {} sharing value 1's buffer); constant segment {} bytes{}",
        args.out.display(),
        size,
        size as f64 / (1u64 << 20) as f64,
        fb.len(),
        base,
        args.values + args.shared,
        constants.len(),
        ACTIVATIONS,
        ints.len(),
        args.shared,
        constant_segment_size,
        if args.blob > 0 {
            format!(", named_data \"blob\" {} bytes in segment 1", args.blob)
        } else {
            String::new()
        }
    );
    Ok(())
}

fn constant_segment_offset(p: &pte_fb::ProgramT, k: usize) -> u64 {
    p.constant_segment
        .as_ref()
        .unwrap()
        .offsets
        .as_ref()
        .unwrap()[k]
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_model: {e}");
            ExitCode::FAILURE
        }
    }
}
