//! Command line and environment -> validated settings.
//!
//! Every knob the spec names is a flag with the spec's environment variable ([`args`]). Each
//! default is declared once, as the `DEFAULT` of the setting it feeds (in the module that owns
//! the setting); the flags show it. [`settings::Settings::from_args`] is the one place raw
//! values become typed settings; the spec's routing knobs are taken as text and fall back to
//! their defaults with a warning when invalid or non-positive, instead of refusing to start.

pub mod args;
pub mod parse;
pub mod settings;

pub use args::{
    AdmissionArgs, BalanceArgs, DiscoveryKind, EbpfArgs, GaugeKind, HashBalanceArgs, KeepAlive,
    LimitArgs, ResilienceArgs, RoutingArgs, ServeArgs, SignalArgs, TimeoutArgs, TraceArgs,
};
pub use parse::{parse_bytes, parse_duration, parse_listen, Dur, DurationError, SizeError};
pub use settings::{routing_knobs, KnobWarning, Settings};
