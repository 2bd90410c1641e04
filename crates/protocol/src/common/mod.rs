//! Pieces every protocol's task cores share — Koala's, DRRS's and the runtime's around them: the
//! typed protocol error, where an input comes from, per-channel event time, the upstream
//! routing core, a task's exit rule (`life`) and a new task's channels before its first start
//! (`unstarted`). They depend on no protocol, so each protocol's modules import them and not one
//! another.

pub(crate) mod edge;
pub(crate) mod error;
pub(crate) mod event_time;
pub(crate) mod input;
pub(crate) mod life;
pub(crate) mod task_config;
pub(crate) mod unstarted;
pub(crate) mod upstream;
