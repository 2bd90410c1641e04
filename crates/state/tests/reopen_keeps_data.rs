//! A worker restarting on its state directory finds its tasks' stores as it left them.

use std::error::Error;

use koala_state::{FjallConfig, FjallEnv, StateEnv, StateError, StateKey, StateWrite};
use koala_types::{OperatorId, TaskId};

type TestResult = Result<(), Box<dyn Error>>;

fn entries(task_index: u32, n: u32) -> Vec<(StateKey, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let key = StateKey::new((i % 128) as u16, 0, i.to_be_bytes().to_vec());
            (key, format!("task{task_index}-value{i:0>200}").into_bytes())
        })
        .collect()
}

fn scan(env: &FjallEnv, task: TaskId) -> Result<Vec<(StateKey, Vec<u8>)>, StateError> {
    let store = env.open_task(task)?;
    let mut out = Vec::new();
    let buckets: Vec<u16> = (0..128).collect();
    store.scan_buckets(&buckets, 1 << 16, &mut |chunk| {
        out.extend(chunk);
        Ok(())
    })?;
    Ok(out)
}

#[test]
fn reopen_keeps_every_task_store_and_forgets_dropped_ones() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Small memtables so part of the data reaches disk tables, the rest only the journal.
    let config = FjallConfig { memtable_bytes: 256 * 1024, ..FjallConfig::default() };
    let tasks = [TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1), TaskId::new(OperatorId(2), 0)];
    let mut expected = Vec::new();
    {
        let env = FjallEnv::open_with(dir.path(), config.clone())?;
        for (i, task) in tasks.iter().enumerate() {
            let store = env.open_task(*task)?;
            let mut data = entries(i as u32, 5_000);
            for part in data.chunks(1_000) {
                store
                    .write_many(part.iter().map(|(k, v)| StateWrite::Put(k.clone(), v.clone())).collect())?;
            }
            data.sort();
            expected.push(data);
        }
        env.drop_task(tasks[2])?;
        // No persist: dropping the env must flush the journal.
    }
    let env = FjallEnv::open_with(dir.path(), config)?;
    assert_eq!(scan(&env, tasks[0])?, expected[0]);
    assert_eq!(scan(&env, tasks[1])?, expected[1]);
    assert_eq!(scan(&env, tasks[2])?, Vec::new());
    Ok(())
}

#[test]
fn a_second_env_on_the_same_directory_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let _env = FjallEnv::open(dir.path())?;
    match FjallEnv::open(dir.path()) {
        Err(StateError::Open { path, .. }) => assert_eq!(path, dir.path()),
        other => panic!("expected an open error, got {other:?}"),
    }
    Ok(())
}
