//! The guards of issue 37, attacked from outside over loopback: the failed-key limit
//! under concurrency (held-back bodies), the client's address behind a real nginx with a
//! spoofed `X-Forwarded-For`, the per-address connection cap, `next`/`previous` links
//! that a `Host` header cannot point elsewhere, and keys with only the rights they need
//! (project secret keys, scoped personal keys, posthog-node and posthog-python
//! evaluating locally with a `phs_` key).

mod limits;
