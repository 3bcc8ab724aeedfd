//! The daemon behind a mount: forking into the background and reporting to the parent
//! (`background`), logging (`logging`), the FUSE session's options (`options`), and serving
//! until unmounted (`serve`), with a watch that shows changes made behind the mount at
//! once (`watch`). `commands::mount` checks everything before the mount and starts it
//! through these.

pub(crate) mod background;
pub(crate) mod logging;
pub(crate) mod options;
pub(crate) mod serve;
pub(crate) mod watch;
