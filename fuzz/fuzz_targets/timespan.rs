//! Timespans (`PT15M`, `00:00:10`, `15m`): parse must answer a number of milliseconds or an error, and
//! what it answers must format back to a timespan that parses to the same number.
//!
//! humantime panics on some inputs (`18446744073709551615s0.5s0.5s`); the runtime catches that panic
//! and answers an error. libFuzzer's panic hook would abort on it all the same, so this target lets
//! that one panic unwind to the runtime's `catch_unwind`. Every other panic aborts as usual.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sm4c_runtime::timespan;
use std::sync::Once;

fn tolerate_humantime_overflow() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let aborting = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or_default();
            if message != "overflow in Duration::new" {
                aborting(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    tolerate_humantime_overflow();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(ms) = timespan::parse(text) {
        let formatted = timespan::format(ms);
        assert_eq!(
            timespan::parse(&formatted),
            Ok(ms),
            "{text:?} parsed to {ms} ms, formatted as {formatted:?}"
        );
    }
});
