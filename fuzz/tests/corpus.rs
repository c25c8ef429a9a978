//! Every checked-in corpus input, seeds and what fuzzing kept or found, runs through its
//! target without breaking a promise: an input that once crashed a decoder stays fixed.

use dpufs_fuzz::Target;

#[test]
fn every_corpus_input_runs_clean_through_its_target() {
    for target in Target::ALL {
        let dir = target.corpus();
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a corpus entry").path())
            .collect();
        // The seeds first, as a fuzzing run starts: an input kept from a run may need the
        // state they make (a file to read).
        inputs.sort_by_key(|p| {
            let seed = p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"));
            (!seed, p.clone())
        });
        assert!(!inputs.is_empty(), "{} has no corpus", target.name());
        let harness = target.harness();
        for input in &inputs {
            let _accepted = harness.run(&std::fs::read(input).expect("a corpus input"));
        }
        eprintln!("{}: {} inputs", target.name(), inputs.len());
    }
}

#[test]
fn the_checked_in_seeds_are_the_encoders_current_output() {
    for (target, name, bytes) in dpufs_fuzz::seeds() {
        let path = target.corpus().join(format!("seed-{name}"));
        let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            stored == bytes,
            "{} differs from its encoder's output: cargo run -p dpufs-fuzz --bin fuzz-seeds",
            path.display()
        );
    }
}

/// Each target's seeds, fed in order to a fresh harness, are all accepted: they reach past
/// the decoders into what the receiving process does with a valid message, which is where
/// AFL's mutations start from.
#[test]
fn every_seed_is_accepted_by_its_target() {
    let seeds = dpufs_fuzz::seeds();
    for target in Target::ALL {
        let harness = target.harness();
        for (_, name, bytes) in seeds.iter().filter(|(t, _, _)| *t == target) {
            assert!(
                harness.run(bytes),
                "{}: seed {name} was refused",
                target.name()
            );
        }
    }
}
