//! Tasks tied to their owner: a task's helpers end when it does.

/// Aborts a task when dropped, so a task's helpers end with it.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
