//! The log of every `koala` process: tracing to the standard error, filtered by `KOALA_LOG`.

use std::io::IsTerminal;

/// Logs to the standard error at `default_level` unless `KOALA_LOG` says otherwise
/// ([`log_filter`]).
pub fn init(default_level: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("KOALA_LOG").ok(), default_level))
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log redirected to a file stays plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The log filter: `KOALA_LOG` (else `default_level`). Unless it names rskafka itself, rskafka is
/// kept to errors (it warns on every refused connection while a broker starts; our own errors
/// already say what failed) and its controller is silent: it logs "topic already exists" as a
/// fatal error, which is what every sink task but the first that creates its topic gets, and
/// which `create_topic` takes as success (any other controller error is returned and reported).
fn log_filter(koala_log: Option<String>, default_level: &str) -> tracing_subscriber::EnvFilter {
    let directives = koala_log.unwrap_or_else(|| default_level.to_string());
    let directives = if directives.contains("rskafka") {
        directives
    } else {
        format!("{directives},rskafka=error,rskafka::client::controller=off")
    };
    tracing_subscriber::EnvFilter::try_new(&directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    /// What a subscriber with [`super::log_filter`] writes for rskafka's controller error (which
    /// it logs when a topic exists), an rskafka warning and an error of ours.
    fn logged(koala_log: Option<&str>) -> String {
        let text = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&text);
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(super::log_filter(koala_log.map(str::to_string), "warn"))
            .with_ansi(false)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "rskafka::client::controller", "request encountered fatal error: TopicAlreadyExists");
            tracing::warn!(target: "rskafka::connection", "connection refused");
            tracing::error!(target: "koala_coordinator::job", "ours");
        });
        let text = text.lock().expect("log").clone();
        String::from_utf8(text).expect("utf-8")
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Writer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An existing sink topic is quiet — rskafka's controller, which logs "topic
    /// already exists" as a fatal error, is silent and the rest of rskafka kept to errors, unless
    /// `KOALA_LOG` names rskafka itself.
    #[test]
    fn rskafkas_controller_is_silent_unless_koala_log_names_it() {
        for koala_log in [None, Some("info"), Some("debug,koala=trace")] {
            let log = logged(koala_log);
            assert!(log.contains("ours"), "{koala_log:?}: our error is logged: {log:?}");
            assert!(!log.contains("TopicAlreadyExists"), "{koala_log:?}: the controller is silent: {log:?}");
            assert!(!log.contains("connection refused"), "{koala_log:?}: rskafka kept to errors: {log:?}");
        }
        let log = logged(Some("warn,rskafka=warn"));
        assert!(log.contains("TopicAlreadyExists") && log.contains("connection refused"), "{log:?}");
    }
}
