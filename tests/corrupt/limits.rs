//! Inputs that once took quadratic time or memory stay fast.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;
use crate::mutate::{program_of, rebuild_pte};
use ptefs::format::generated::{ptd_fb, pte_fb};
use ptefs::format::writer::{
    pack_flat_tensor, pack_program, ptd_program_region, pte_program_region,
};
use ptefs::format::Model;
use ptefs::format::{Kind, ModelFile};
use ptefs::tree::Tree;

/// A small file whose vectors point many times at one table passes the FlatBuffers verifier's
/// default limits and would unpack into hundreds of megabytes (here 400 KB into 350 MB, and a
/// few MB into more than the machine has). It is refused, quickly, saying why.
#[test]
fn shared_tables_cannot_multiply_memory() {
    let orig = common::fixture_bytes("linear.pte");
    let program = program_of(&orig);
    // A program whose plan vector holds the first plan `n` times, one table shared by all.
    let shared = |n: usize| {
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let plan = program.execution_plan.as_ref().unwrap()[0].pack(&mut fbb);
        let plans = fbb.create_vector(&vec![plan; n]);
        let root = pte_fb::Program::create(
            &mut fbb,
            &pte_fb::ProgramArgs {
                execution_plan: Some(plans),
                ..Default::default()
            },
        );
        fbb.finish(root, Some("ET12"));
        pte_program_region(fbb.finished_data(), 16, 128, 0, false).0
    };
    let bytes = shared(100_000);
    assert!(bytes.len() < 500_000);
    let t = Instant::now();
    let err = Kind::parse(&bytes).unwrap_err();
    assert!(err.message().contains("Apparent size"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Sharing on the scale of real files (vtables, a few tables) stays accepted.
    let bytes = shared(2);
    assert!(Kind::parse(&bytes).is_ok());
}

/// Many plans: rendering every value's JSON stays linear in the number of plans (each names
/// its own path, which once recomputed every plan's directory name: 8,000 plans of one
/// tensor each, a 600 KB file, took 8.5 s in a release build, 32,000 over two minutes).
#[test]
fn many_plans_render_in_linear_time() {
    let n = 8000;
    let plans = (0..n)
        .map(|i| {
            let tensor = mk!(pte_fb::TensorT {
                sizes: Some(vec![1]),
                dim_order: Some(vec![0]),
            });
            mk!(pte_fb::ExecutionPlanT {
                name: Some(format!("p{}", i % 100)),
                values: Some(vec![mk!(pte_fb::EValueT {
                    val: pte_fb::KernelTypesT::Tensor(Box::new(tensor))
                })]),
            })
        })
        .collect();
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(plans),
        constant_segment: Some(Box::new(mk!(pte_fb::SubsegmentOffsetsT {
            segment_index: 0,
            offsets: Some(vec![0, 0]),
        }))),
        segments: Some(vec![mk!(pte_fb::DataSegmentT { offset: 0, size: 4 })]),
    });
    let fb = pack_program(&program, 16);
    let (mut bytes, base) = pte_program_region(&fb, 16, 128, 4, true);
    bytes.resize(base as usize + 4, 7);
    let t = Instant::now();
    let file = ModelFile::from_bytes(Path::new("plans.pte"), bytes).unwrap();
    let tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    let mut rendered = 0;
    for ino in 1..=tree.node_count() {
        if let ptefs::tree::Content::Text { .. } = tree.node(ino).unwrap().content {
            rendered += tree.text(ino).unwrap().len();
        }
    }
    assert!(rendered > 0);
    let last = tree.find("plans/p99~79/values/0.json").unwrap();
    let json: serde_json::Value = serde_json::from_slice(&tree.text(last).unwrap()).unwrap();
    assert_eq!(json["index"], 0);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Many equal keys: naming them `k`, `k~1`, `k~2`, … stays linear (it tried every suffix from
/// 1 for each repeat: 40,000 equal keys, a 640 KB file, took 57 s in a release build).
#[test]
fn many_equal_keys_are_named_in_linear_time() {
    let orig = common::fixture_bytes("linear.pte");
    let mut program = program_of(&orig);
    program.named_data = Some(
        (0..20_000)
            .map(|_| {
                mk!(pte_fb::NamedDataT {
                    key: Some("k".into()),
                    segment_index: 0,
                })
            })
            .collect(),
    );
    let t = Instant::now();
    let file = ModelFile::from_bytes(Path::new("keys.pte"), rebuild_pte(&orig, &program)).unwrap();
    let tree = Tree::build(Arc::new(Model::from_files(vec![file]).unwrap()));
    assert!(tree.find("named_data/k.bin").is_some());
    assert!(tree.find("named_data/k~19999.json").is_some());
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Many EXTERNAL tensors resolved against a `.ptd` with as many keys: linear, not tensors ×
/// keys (40,000 of each took 2.8 s in a release build). Duplicate and missing keys are still
/// reported.
#[test]
fn many_external_tensors_resolve_in_linear_time() {
    let n = 40_000;
    let tensor = |key: String| {
        mk!(pte_fb::EValueT {
            val: pte_fb::KernelTypesT::Tensor(Box::new(mk!(pte_fb::TensorT {
                scalar_type: pte_fb::ScalarType::FLOAT,
                sizes: Some(vec![1]),
                dim_order: Some(vec![0]),
                extra_tensor_info: Some(Box::new(mk!(pte_fb::ExtraTensorInfoT {
                    fully_qualified_name: Some(key),
                    location: pte_fb::TensorDataLocation::EXTERNAL,
                }))),
            })))
        })
    };
    let mut values: Vec<_> = (0..n).map(|i| tensor(format!("w{i}"))).collect();
    values.push(tensor("missing".into()));
    let program = mk!(pte_fb::ProgramT {
        execution_plan: Some(vec![mk!(pte_fb::ExecutionPlanT {
            name: Some("forward".into()),
            values: Some(values),
        })]),
    });
    let (pte, _) = pte_program_region(&pack_program(&program, 16), 16, 128, 0, false);
    let ptd = |keys: Vec<String>| {
        let ft = mk!(ptd_fb::FlatTensorT {
            segments: Some(vec![mk!(ptd_fb::DataSegmentT { offset: 0, size: 4 })]),
            named_data: Some(
                keys.into_iter()
                    .map(|key| {
                        mk!(ptd_fb::NamedDataT {
                            key: Some(key),
                            tensor_layout: Some(Box::new(mk!(ptd_fb::TensorLayoutT {
                                scalar_type: ptefs::format::generated::flat_tensor::executorch_flatbuffer::ScalarType(6),
                                sizes: Some(vec![1]),
                                dim_order: Some(vec![0]),
                            }))),
                        })
                    })
                    .collect(),
            ),
        });
        let (mut b, base) = ptd_program_region(&pack_flat_tensor(&ft), 128, 4);
        b.resize(base as usize + 4, 1);
        b
    };
    let a = ptd((0..n).map(|i| format!("w{i}")).collect());
    let b = ptd(vec!["w7".into()]);
    let t = Instant::now();
    let files = vec![
        ModelFile::from_bytes(Path::new("ext.pte"), pte).unwrap(),
        ModelFile::from_bytes(Path::new("a.ptd"), a).unwrap(),
        ModelFile::from_bytes(Path::new("b.ptd"), b).unwrap(),
    ];
    let model = Model::from_files(files).unwrap();
    let took = t.elapsed();
    let layout = model.pte_layout.as_ref().unwrap();
    let located = layout.plans[0]
        .tensors
        .iter()
        .flatten()
        .filter(|t| t.location.is_some());
    assert_eq!(located.count(), n - 1);
    let defects = &layout.defects;
    assert_eq!(defects.len(), 2, "{defects:?}");
    assert!(defects
        .iter()
        .any(|d| d.contains("\"w7\" appears in more than one")));
    assert!(defects.iter().any(|d| d.contains("\"missing\" not found")));
    assert!(took < Duration::from_secs(10), "{took:?}");
}
