//! `koala broker status` answers scripts by its exit code: non-zero when no broker runs.

mod common;

#[test]
fn broker_status_without_a_broker_exits_non_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = common::koala()
        .args(["broker", "status", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run koala broker status");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "status without a broker exited 0");
    assert!(stderr.contains("no broker running"), "{stderr}");
}
