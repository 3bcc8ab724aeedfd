//! The table of structured edits: each changes one thing in a fixture's flatbuffer tables,
//! and the lists of those that `check` must flag.

use crate::mutate::{
    any_tensor, instructions, on_last, on_tensors, plans, tensors, with_bytes, PtdEdit, PteEdit,
    HUGE,
};
use ptefs::format::generated::{ptd_fb, pte_fb};

pub fn pte_edits() -> Vec<(String, PteEdit)> {
    use pte_fb::{InstructionArgumentsT as I, KernelTypesT as K};
    let mut e: Vec<(String, PteEdit)> = Vec::new();
    let mut add = |name: &str, f: PteEdit| e.push((name.to_string(), f));
    for (k, v) in [(0usize, u64::MAX), (0, HUGE), (1, u64::MAX), (1, 1 << 40)] {
        add(
            &format!("segment offset/size field {k} = {v}"),
            Box::new(move |p| {
                on_last(&mut p.segments, |s| {
                    if k == 0 {
                        s.offset = v
                    } else {
                        s.size = v
                    }
                })
            }),
        );
    }
    add(
        "segment offset + size overflow",
        Box::new(|p| {
            if let Some(s) = p.segments.as_mut().and_then(|s| s.first_mut()) {
                s.offset = HUGE * 3;
                s.size = HUGE * 2;
            }
            true
        }),
    );
    add(
        "extra segment past the end",
        Box::new(|p| {
            p.segments
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::DataSegmentT {
                    offset: 1 << 20,
                    size: 1,
                }));
            true
        }),
    );
    add("segments absent", Box::new(|p| p.segments.take().is_some()));
    add(
        "segments empty",
        Box::new(|p| p.segments.replace(vec![]).is_some()),
    );
    for v in [u64::MAX, HUGE, 1 << 20, 1] {
        add(
            &format!("constant offsets = {v}"),
            Box::new(move |p| {
                let Some(o) = p.constant_segment.as_mut().and_then(|c| c.offsets.as_mut()) else {
                    return false;
                };
                for x in o.iter_mut().skip(1) {
                    *x = v;
                }
                true
            }),
        );
    }
    for v in [u32::MAX, 1, 7] {
        add(
            &format!("constant segment_index = {v}"),
            Box::new(move |p| {
                p.constant_segment
                    .as_mut()
                    .map(|c| c.segment_index = v)
                    .is_some()
            }),
        );
    }
    add(
        "constant offsets absent",
        Box::new(|p| {
            p.constant_segment
                .as_mut()
                .map(|c| c.offsets = None)
                .is_some()
        }),
    );
    add(
        "constant offsets empty",
        Box::new(|p| {
            p.constant_segment
                .as_mut()
                .map(|c| c.offsets = Some(vec![]))
                .is_some()
        }),
    );
    add(
        "constant_segment absent",
        Box::new(|p| p.constant_segment.take().is_some()),
    );
    add(
        "inline constant buffers too short",
        Box::new(|p| {
            p.constant_segment = None;
            p.constant_buffer = Some(vec![
                mk!(pte_fb::BufferT {
                    storage: Some(vec![1, 2])
                });
                3
            ]);
            true
        }),
    );
    add(
        "inline constant buffers and constant segment",
        Box::new(|p| {
            p.constant_buffer = Some(vec![mk!(pte_fb::BufferT { storage: None }); 2]);
            true
        }),
    );
    for v in [u64::MAX, HUGE, 1 << 30] {
        add(
            &format!("mutable offsets = {v}"),
            Box::new(move |p| {
                let Some(m) = p.mutable_data_segments.as_mut().and_then(|m| m.first_mut()) else {
                    return false;
                };
                for x in m.offsets.iter_mut().flatten().skip(1) {
                    *x = v;
                }
                true
            }),
        );
    }
    add(
        "mutable segment_index huge",
        Box::new(|p| {
            p.mutable_data_segments
                .iter_mut()
                .flatten()
                .map(|m| m.segment_index = u32::MAX)
                .count()
                > 0
        }),
    );
    add(
        "mutable_data_segments empty",
        Box::new(|p| p.mutable_data_segments.replace(vec![]).is_some()),
    );
    add(
        "two mutable_data_segments",
        Box::new(|p| {
            let m = p.mutable_data_segments.get_or_insert_with(Vec::new);
            m.push(mk!(pte_fb::SubsegmentOffsetsT {
                segment_index: 99,
                offsets: Some(vec![0, u64::MAX]),
            }));
            m.push(mk!(pte_fb::SubsegmentOffsetsT {
                segment_index: 0,
                offsets: None,
            }));
            true
        }),
    );
    for all in [false, true] {
        let w = if all {
            "all tensors"
        } else {
            "a tensor with bytes"
        };
        let pick = if all { any_tensor } else { with_bytes };
        let sizes: [(&str, Vec<i32>); 7] = [
            ("sizes [-1]", vec![-1]),
            ("sizes [i32::MIN]", vec![i32::MIN]),
            ("sizes [3, -4]", vec![3, -4]),
            ("sizes overflowing 64 bits", vec![i32::MAX; 8]),
            ("sizes [i32::MAX, i32::MAX]", vec![i32::MAX, i32::MAX]),
            ("sizes of rank 40", vec![1; 40]),
            ("sizes of rank 300", vec![1; 300]),
        ];
        for (name, s) in sizes {
            let rank = s.len();
            add(
                &format!("{w}: {name}"),
                on_tensors(all, pick, move |t| {
                    t.sizes = Some(s.clone());
                    t.dim_order = Some((0..rank).map(|d| d as u8).collect());
                }),
            );
        }
        add(
            &format!("{w}: sizes absent"),
            on_tensors(all, pick, |t| t.sizes = None),
        );
        add(
            &format!("{w}: dim_order absent"),
            on_tensors(all, pick, |t| t.dim_order = None),
        );
        add(
            &format!("{w}: dim_order [255]"),
            on_tensors(all, pick, |t| {
                t.dim_order = Some(vec![255; t.sizes.as_ref().map_or(1, Vec::len)])
            }),
        );
        add(
            &format!("{w}: dim_order repeated"),
            on_tensors(all, pick, |t| {
                t.dim_order = Some(vec![0; t.sizes.as_ref().map_or(1, Vec::len)])
            }),
        );
        add(
            &format!("{w}: dim_order too long"),
            on_tensors(all, pick, |t| t.dim_order = Some((0..=255).collect())),
        );
        for st in [-1i8, 30, 100, i8::MAX, i8::MIN, 15, 16, 23] {
            add(
                &format!("{w}: scalar_type {st}"),
                on_tensors(all, pick, move |t| t.scalar_type = pte_fb::ScalarType(st)),
            );
        }
        add(
            &format!("{w}: data_buffer_idx huge"),
            on_tensors(all, pick, |t| t.data_buffer_idx = u32::MAX),
        );
        add(
            &format!("{w}: data_buffer_idx 1"),
            on_tensors(all, pick, |t| t.data_buffer_idx = 1),
        );
        add(
            &format!("{w}: mutable with huge index"),
            on_tensors(all, pick, |t| {
                t.data_buffer_idx = u32::MAX - 1;
                t.allocation_info = Some(Box::new(mk!(pte_fb::AllocationDetailsT {
                    memory_id: u32::MAX,
                    memory_offset_low: u32::MAX,
                    memory_offset_high: u32::MAX,
                })));
            }),
        );
        add(
            &format!("{w}: storage_offset"),
            on_tensors(all, pick, |t| t.storage_offset = i32::MIN),
        );
        add(
            &format!("{w}: shape_dynamism 99"),
            on_tensors(all, pick, |t| {
                t.shape_dynamism = pte_fb::TensorShapeDynamism(99)
            }),
        );
        add(
            &format!("{w}: layout -1"),
            on_tensors(all, pick, |t| t.layout = -1),
        );
        for (name, fqn, loc) in [
            (
                "EXTERNAL without a name",
                None,
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            (
                "EXTERNAL of a missing key",
                Some("no such key"),
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            (
                "EXTERNAL named '/'",
                Some("/"),
                pte_fb::TensorDataLocation::EXTERNAL,
            ),
            ("location 77", Some(".."), pte_fb::TensorDataLocation(77)),
        ] {
            add(
                &format!("{w}: {name}"),
                on_tensors(all, pick, move |t| {
                    t.extra_tensor_info = Some(Box::new(mk!(pte_fb::ExtraTensorInfoT {
                        mutable_data_segments_idx: u64::MAX,
                        fully_qualified_name: fqn.map(str::to_string),
                        location: loc,
                        device_type: pte_fb::DeviceType(99),
                        device_index: -1,
                    })))
                }),
            );
        }
    }
    add(
        "delegate location 7, index huge",
        Box::new(|p| {
            let mut any = false;
            for plan in plans(p) {
                for d in plan.delegates.iter_mut().flatten() {
                    d.processed = Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                        location: pte_fb::DataLocation(7),
                        index: u32::MAX,
                    })));
                    any = true;
                }
            }
            any
        }),
    );
    for (loc, index) in [
        (pte_fb::DataLocation::SEGMENT, u32::MAX),
        (pte_fb::DataLocation::SEGMENT, 99),
        (pte_fb::DataLocation::INLINE, 0),
        (pte_fb::DataLocation::INLINE, u32::MAX),
    ] {
        add(
            &format!("delegate {loc:?} index {index}"),
            Box::new(move |p| {
                let mut any = false;
                for plan in plans(p) {
                    for d in plan.delegates.iter_mut().flatten() {
                        d.processed = Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                            location: loc,
                            index: index,
                        })));
                        any = true;
                    }
                }
                any
            }),
        );
    }
    add(
        "inline delegate data",
        Box::new(|p| {
            p.backend_delegate_data = Some(vec![
                mk!(pte_fb::BackendDelegateInlineDataT {
                    data: Some(vec![7; 100]),
                }),
                mk!(pte_fb::BackendDelegateInlineDataT { data: None }),
            ]);
            for plan in plans(p) {
                plan.delegates
                    .get_or_insert_with(Vec::new)
                    .push(mk!(pte_fb::BackendDelegateT {
                        id: None,
                        processed: Some(Box::new(mk!(pte_fb::BackendDelegateDataReferenceT {
                            location: pte_fb::DataLocation::INLINE,
                            index: 1,
                        }))),
                        compile_specs: Some(vec![mk!(pte_fb::CompileSpecT {
                            key: None,
                            value: Some(vec![0; 1000]),
                        })]),
                    }));
            }
            true
        }),
    );
    add(
        "delegates without processed or id",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .flat_map(|pl| pl.delegates.iter_mut().flatten())
                .map(|d| {
                    d.processed = None;
                    d.id = None;
                })
                .count()
                > 0
        }),
    );
    for (name, keys) in [
        (
            "named_data keys that are not file names",
            vec!["/", "..", ".", "", "%", "a/b", "x\0y", "%2F"],
        ),
        ("duplicate named_data keys", vec!["k", "k", "k~1", "k"]),
    ] {
        add(
            name,
            Box::new(move |p| {
                let nd = p.named_data.get_or_insert_with(Vec::new);
                for (i, k) in keys.iter().enumerate() {
                    nd.push(mk!(pte_fb::NamedDataT {
                        key: Some(k.to_string()),
                        segment_index: i as u32 % 2,
                    }));
                }
                true
            }),
        );
    }
    add(
        "named_data segment index huge, key absent",
        Box::new(|p| {
            p.named_data
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::NamedDataT {
                    key: None,
                    segment_index: u32::MAX,
                }));
            true
        }),
    );
    add(
        "named_data without segments",
        Box::new(|p| {
            p.segments = None;
            p.named_data
                .get_or_insert_with(Vec::new)
                .push(mk!(pte_fb::NamedDataT {
                    key: Some("k".into()),
                    segment_index: 0,
                }));
            true
        }),
    );
    for (name, plan_name) in [
        ("empty", ""),
        ("dot", "."),
        ("dotdot", ".."),
        ("slash", "a/b"),
        ("percent", "%"),
        ("nul", "\0"),
    ] {
        add(
            &format!("plan name {name}"),
            Box::new(move |p| {
                plans(p)
                    .into_iter()
                    .map(|pl| pl.name = Some(plan_name.to_string()))
                    .count()
                    > 0
            }),
        );
    }
    add(
        "plan name absent",
        Box::new(|p| plans(p).into_iter().map(|pl| pl.name = None).count() > 0),
    );
    add(
        "duplicate plans",
        Box::new(|p| {
            let Some(v) = p.execution_plan.as_mut() else {
                return false;
            };
            let copy = v.clone();
            v.extend(copy.clone());
            v.extend(copy);
            true
        }),
    );
    add(
        "execution_plan absent",
        Box::new(|p| p.execution_plan.take().is_some()),
    );
    add(
        "plan vectors absent",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.values = None;
                    pl.inputs = None;
                    pl.outputs = None;
                    pl.chains = None;
                    pl.operators = None;
                    pl.delegates = None;
                    pl.non_const_buffer_sizes = None;
                    pl.container_meta_type = None;
                })
                .count()
                > 0
        }),
    );
    add(
        "inputs and outputs out of range",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.inputs = Some(vec![-1, i32::MAX, i32::MIN]);
                    pl.outputs = Some(vec![i32::MAX]);
                    pl.non_const_buffer_sizes = Some(vec![-1, i64::MIN, i64::MAX]);
                })
                .count()
                > 0
        }),
    );
    for v in [-1i32, i32::MAX, i32::MIN] {
        add(
            &format!("instruction indices {v}"),
            Box::new(move |p| {
                let mut any = false;
                for ins in instructions(p) {
                    match &mut ins.instr_args {
                        I::KernelCall(k) => {
                            k.op_index = v;
                            k.args = Some(vec![v, 0, v]);
                        }
                        I::DelegateCall(d) => {
                            d.delegate_index = v;
                            d.args = Some(vec![v]);
                        }
                        _ => {}
                    }
                    any = true;
                }
                any
            }),
        );
        add(
            &format!("control instructions {v}"),
            Box::new(move |p| {
                for pl in plans(p) {
                    let chains = pl.chains.get_or_insert_with(Vec::new);
                    chains.push(mk!(pte_fb::ChainT {
                        inputs: Some(vec![v]),
                        outputs: None,
                        instructions: Some(vec![
                            mk!(pte_fb::InstructionT {
                                instr_args: I::NONE,
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::MoveCall(Box::new(mk!(pte_fb::MoveCallT {
                                    move_from: v,
                                    move_to: v,
                                }))),
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::JumpFalseCall(Box::new(mk!(
                                    pte_fb::JumpFalseCallT {
                                        cond_value_index: v,
                                        destination_instruction: v,
                                    }
                                ))),
                            }),
                            mk!(pte_fb::InstructionT {
                                instr_args: I::FreeCall(Box::new(mk!(pte_fb::FreeCallT {
                                    value_index: v,
                                }))),
                            }),
                        ]),
                        stacktrace: Some(vec![mk!(pte_fb::FrameListT {
                            items: Some(vec![mk!(pte_fb::FrameT {
                                filename: None,
                                lineno: v,
                                name: Some("\0".into()),
                                context: None,
                            })]),
                        })]),
                    }));
                    chains.push(pte_fb::ChainT::default());
                }
                true
            }),
        );
    }
    add(
        "odd values",
        Box::new(|p| {
            for pl in plans(p) {
                let values = pl.values.get_or_insert_with(Vec::new);
                let n = values.len() as i32;
                for val in [
                    K::NONE,
                    K::Double(Box::new(mk!(pte_fb::DoubleT {
                        double_val: f64::NAN,
                    }))),
                    K::Double(Box::new(mk!(pte_fb::DoubleT {
                        double_val: f64::NEG_INFINITY,
                    }))),
                    K::String(Box::new(mk!(pte_fb::StringT {
                        string_val: Some("\0\"\\\u{7f}é".into()),
                    }))),
                    K::String(Box::new(mk!(pte_fb::StringT { string_val: None }))),
                    K::TensorList(Box::new(mk!(pte_fb::TensorListT {
                        items: Some(vec![-1, n, i32::MAX, 0]),
                    }))),
                    K::OptionalTensorList(Box::new(mk!(pte_fb::OptionalTensorListT {
                        items: Some(vec![-1, -2, i32::MIN]),
                    }))),
                    K::DoubleList(Box::new(mk!(pte_fb::DoubleListT {
                        items: Some(vec![f64::INFINITY, f64::NAN, -0.0]),
                    }))),
                    K::BoolList(Box::new(mk!(pte_fb::BoolListT { items: None }))),
                    K::IntList(Box::new(mk!(pte_fb::IntListT {
                        items: Some(vec![i64::MIN, i64::MAX]),
                    }))),
                    K::Tensor(Box::default()),
                ] {
                    values.push(mk!(pte_fb::EValueT { val: val }));
                }
            }
            true
        }),
    );
    add(
        "operators without names",
        Box::new(|p| {
            plans(p)
                .into_iter()
                .map(|pl| {
                    pl.operators
                        .get_or_insert_with(Vec::new)
                        .push(mk!(pte_fb::OperatorT {
                            name: None,
                            overload: Some("\0/".into()),
                        }))
                })
                .count()
                > 0
        }),
    );
    add(
        "many values sharing one constant",
        Box::new(|p| {
            let Some(t) = tensors(p)
                .into_iter()
                .find(|t| with_bytes(t))
                .map(|t| t.clone())
            else {
                return false;
            };
            for pl in plans(p) {
                let values = pl.values.get_or_insert_with(Vec::new);
                for _ in 0..300 {
                    values.push(mk!(pte_fb::EValueT {
                        val: K::Tensor(Box::new(t.clone())),
                    }));
                }
            }
            true
        }),
    );
    add(
        "version 99",
        Box::new(|p| {
            p.version = u32::MAX;
            true
        }),
    );
    e
}

pub fn ptd_edits() -> Vec<(String, PtdEdit)> {
    let mut e: Vec<(String, PtdEdit)> = Vec::new();
    let mut add = |name: &str, f: PtdEdit| e.push((name.to_string(), f));
    for (k, v) in [
        (0usize, u64::MAX),
        (0, HUGE),
        (1, u64::MAX),
        (1, 1 << 40),
        (1, 0),
    ] {
        add(
            &format!("segment field {k} = {v}"),
            Box::new(move |f| {
                on_last(&mut f.segments, |s| {
                    if k == 0 {
                        s.offset = v
                    } else {
                        s.size = v
                    }
                })
            }),
        );
    }
    add("segments absent", Box::new(|f| f.segments.take().is_some()));
    add(
        "named_data absent",
        Box::new(|f| f.named_data.take().is_some()),
    );
    add(
        "version 2",
        Box::new(|f| {
            f.version = 2;
            true
        }),
    );
    let layouts: Vec<(&str, i8, Vec<i32>, Vec<u8>)> = vec![
        ("negative size", 6, vec![-3], vec![0]),
        ("huge sizes", 6, vec![i32::MAX; 8], (0..8).collect()),
        ("too big for the segment", 6, vec![1 << 20], vec![0]),
        ("bad dim_order", 6, vec![3, 4], vec![1, 1]),
        ("short dim_order", 6, vec![3, 4], vec![0]),
        ("unknown scalar type", 99, vec![3], vec![0]),
        ("bfloat16", 15, vec![2], vec![0]),
        ("rank 0", 6, vec![], vec![]),
    ];
    for (name, st, sizes, order) in layouts {
        add(
            &format!("tensor_layout {name}"),
            Box::new(move |f| {
                let mut any = false;
                for nd in f.named_data.iter_mut().flatten() {
                    nd.tensor_layout = Some(Box::new(mk!(ptd_fb::TensorLayoutT {
                        scalar_type:
                            ptefs::format::generated::flat_tensor::executorch_flatbuffer::ScalarType(
                                st
                            ),
                        sizes: Some(sizes.clone()),
                        dim_order: Some(order.clone()),
                    })));
                    any = true;
                }
                any
            }),
        );
    }
    add(
        "tensor_layout vectors absent",
        Box::new(|f| {
            f.named_data
                .iter_mut()
                .flatten()
                .map(|nd| {
                    if let Some(l) = nd.tensor_layout.as_mut() {
                        l.sizes = None;
                        l.dim_order = None;
                    }
                })
                .count()
                > 0
        }),
    );
    add(
        "named_data segment index huge",
        Box::new(|f| {
            f.named_data
                .iter_mut()
                .flatten()
                .map(|nd| nd.segment_index = u32::MAX)
                .count()
                > 0
        }),
    );
    add(
        "duplicate and odd keys",
        Box::new(|f| {
            let nd = f.named_data.get_or_insert_with(Vec::new);
            let copy = nd.clone();
            nd.extend(copy);
            for k in ["/", "..", "", "a/../b"] {
                nd.push(mk!(ptd_fb::NamedDataT {
                    key: Some(k.into()),
                    segment_index: 0,
                    tensor_layout: None,
                }));
            }
            nd.push(mk!(ptd_fb::NamedDataT {
                key: None,
                segment_index: 0,
                tensor_layout: None,
            }));
            true
        }),
    );
    e
}

/// Edits that break what the runtime relies on in every file they apply to
/// (docs/formats.md#what-the-runtime-checks-at-load): `check` must report them, if parsing does
/// not refuse them already.
pub const FLAGGED_PTE_EDITS: &[&str] = &[
    "segment offset/size field",
    "segment offset + size overflow",
    "constant offsets absent",
    "constant offsets empty",
    "constant_segment absent",
    "inline constant buffers",
    "two mutable_data_segments",
    "all tensors: sizes [-1]",
    "all tensors: sizes [i32::MIN]",
    "all tensors: sizes [3, -4]",
    "all tensors: sizes overflowing 64 bits",
    "all tensors: sizes of rank",
    "all tensors: sizes absent",
    "all tensors: dim_order absent",
    "all tensors: dim_order [255]",
    "all tensors: dim_order too long",
    "all tensors: scalar_type -1",
    "all tensors: scalar_type 30",
    "all tensors: scalar_type 100",
    "all tensors: scalar_type 127",
    "all tensors: scalar_type -128",
    "all tensors: data_buffer_idx huge",
    "all tensors: mutable with huge index",
    "all tensors: storage_offset",
    "all tensors: EXTERNAL without a name",
    "delegate location 7",
    "delegate SEGMENT",
    "delegate INLINE index 4294967295",
    "delegates without processed or id",
    "named_data segment index huge",
    "named_data without segments",
    "plan name absent",
    "execution_plan absent",
    "plan vectors absent",
    "inputs and outputs out of range",
    "instruction indices",
    "control instructions",
    "odd values",
    "operators without names",
];

pub const FLAGGED_PTD_EDITS: &[&str] = &[
    "segment field 0",
    "segment field 1 = 18446744073709551615",
    "segment field 1 = 1099511627776",
    "segments absent",
    "named_data absent",
    "version 2",
    "tensor_layout negative size",
    "tensor_layout huge sizes",
    "tensor_layout too big for the segment",
    "tensor_layout bad dim_order",
    "tensor_layout short dim_order",
    "tensor_layout unknown scalar type",
    "named_data segment index huge",
    "duplicate and odd keys",
];
