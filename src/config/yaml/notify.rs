//! The `notify` map and its `webhooks` list (types in [`crate::config::notify`]).

use std::collections::BTreeMap;

use crate::config::notify::{
    DEFAULT_WEBHOOK_RETRIES, DEFAULT_WEBHOOK_TIMEOUT, NotifyConfig, NotifyEvent, NotifyUrl,
    WebhookConfig,
};
use crate::config::yaml::{Ctx, KeySeed, Scalar, ValueSeed, duration, text};
#[allow(unused_imports)]
use crate::config::*;
use crate::storage::s3::Secret;

/// Keys of the `notify` map.
pub(crate) const NOTIFY_KEYS: &[&str] = &["heartbeat-url", "heartbeat-interval", "webhooks"];
/// Keys of one `notify.webhooks` entry.
pub(crate) const WEBHOOK_KEYS: &[&str] =
    &["name", "url", "headers", "events", "timeout", "retries"];
/// Shortest accepted ping interval: a monitor checked more often than that is a typo.
pub(crate) const MIN_PING_INTERVAL: Duration = Duration::from_secs(1);
/// Most retries of one webhook call.
const MAX_RETRIES: i128 = 20;

/// `heartbeat-url` / a webhook's `url`.
pub(crate) fn notify_url(s: Scalar<'_>) -> Result<NotifyUrl, String> {
    NotifyUrl::parse(&text(s)?)
}

/// `heartbeat-interval` of the ping.
pub(crate) fn ping_interval(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < MIN_PING_INTERVAL {
        return Err(format!(
            "{s}: the heartbeat ping interval must be at least 1s"
        ));
    }
    Ok(d)
}

fn positive(s: Scalar<'_>) -> Result<Duration, String> {
    match duration(s)? {
        d if d.is_zero() => Err("must be greater than zero".into()),
        d => Ok(d),
    }
}

fn retries(s: Scalar<'_>) -> Result<u32, String> {
    match s {
        Scalar::Int(i) if (0..=MAX_RETRIES).contains(&i) => Ok(i as u32),
        other => Err(format!(
            "expected a whole number from 0 to {MAX_RETRIES}, found {other}"
        )),
    }
}

/// The `notify` map.
pub(crate) struct NotifySeed<'a> {
    pub(crate) ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for NotifySeed<'_> {
    type Value = NotifyConfig;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<NotifyConfig, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NotifySeed<'_> {
    type Value = NotifyConfig;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with the keys `heartbeat-url`, `heartbeat-interval`, `webhooks`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<NotifyConfig, E> {
        Ok(NotifyConfig::default())
    }
    visit_scalars!(not_a_map);
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<NotifyConfig, A::Error> {
        self.not_a_map(Scalar::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NotifyConfig, A::Error> {
        let (ctx, place) = (self.ctx, "in notify");
        let mut seen = Vec::new();
        let mut cfg = NotifyConfig::default();
        let mut interval_set = false;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: NOTIFY_KEYS,
            top_only: &[],
            seen: &mut seen,
            place,
        })? {
            match key {
                "heartbeat-url" => {
                    cfg.heartbeat_url = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &notify_url,
                    })?)
                }
                "heartbeat-interval" => {
                    interval_set = true;
                    cfg.heartbeat_interval = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &ping_interval,
                    })?
                }
                _ => cfg.webhooks = map.next_value_seed(WebhooksSeed { ctx })?,
            }
        }
        if interval_set && cfg.heartbeat_url.is_none() {
            return Err(ctx.fail(
                "key `heartbeat-interval` in notify does nothing without `heartbeat-url`: set \
                 the URL to ping, or remove the interval"
                    .into(),
            ));
        }
        Ok(cfg)
    }
}

impl NotifySeed<'_> {
    /// The value is never echoed: it may be a URL holding a token.
    fn not_a_map<E: de::Error>(self, _: Scalar<'_>) -> Result<NotifyConfig, E> {
        Err(self.ctx.fail(
            "`notify` takes a map with the keys `heartbeat-url`, `heartbeat-interval`, \
             `webhooks`"
                .into(),
        ))
    }
}

/// The `notify.webhooks` list.
struct WebhooksSeed<'a> {
    ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for WebhooksSeed<'_> {
    type Value = Vec<WebhookConfig>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WebhooksSeed<'_> {
    type Value = Vec<WebhookConfig>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of webhooks, each a map with at least `url`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    visit_scalars!(not_a_list);
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.not_a_list(Scalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut hooks: Vec<WebhookConfig> = Vec::new();
        while let Some(h) = seq.next_element_seed(WebhookSeed {
            ctx: self.ctx,
            index: hooks.len(),
            taken: &hooks,
        })? {
            hooks.push(h);
        }
        Ok(hooks)
    }
}

impl WebhooksSeed<'_> {
    /// The value is never echoed: it may be a URL holding a token.
    fn not_a_list<E: de::Error>(self, _: Scalar<'_>) -> Result<Vec<WebhookConfig>, E> {
        Err(self.ctx.fail(
            "`notify.webhooks` takes a list of webhooks, each a map with at least `url` \
             (`- url: https://...`)"
                .into(),
        ))
    }
}

/// One `notify.webhooks` entry.
struct WebhookSeed<'a> {
    ctx: &'a Ctx,
    index: usize,
    /// The entries before it (names must differ: they label the metrics).
    taken: &'a [WebhookConfig],
}

impl WebhookSeed<'_> {
    /// The value is never echoed: it may be a URL holding a token.
    fn not_a_map<E: de::Error>(self, _: Scalar<'_>) -> Result<WebhookConfig, E> {
        Err(self.ctx.fail(format!(
            "notify.webhooks[{}] is not a map: write `- url: https://...` (with `name`, \
             `headers`, `events`, `timeout`, `retries` as needed)",
            self.index
        )))
    }
}

impl<'de> DeserializeSeed<'de> for WebhookSeed<'_> {
    type Value = WebhookConfig;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<WebhookConfig, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WebhookSeed<'_> {
    type Value = WebhookConfig;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a webhook: a map with at least `url`")
    }
    visit_scalars!(not_a_map);
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<WebhookConfig, A::Error> {
        self.not_a_map(Scalar::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WebhookConfig, A::Error> {
        let ctx = self.ctx;
        let place = format!("in notify.webhooks[{}]", self.index);
        let place = place.as_str();
        let mut seen = Vec::new();
        let mut name = None;
        let mut url = None;
        let mut headers = Vec::new();
        let mut events = NotifyEvent::ALL.to_vec();
        let mut timeout = DEFAULT_WEBHOOK_TIMEOUT;
        let mut tries = DEFAULT_WEBHOOK_RETRIES;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: WEBHOOK_KEYS,
            top_only: &[],
            seen: &mut seen,
            place,
        })? {
            match key {
                "name" => name = Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &text))?),
                "url" => {
                    url = Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &notify_url))?)
                }
                "timeout" => {
                    timeout = map.next_value_seed(ValueSeed::new(ctx, key, place, &positive))?
                }
                "retries" => {
                    tries = map.next_value_seed(ValueSeed::new(ctx, key, place, &retries))?
                }
                "headers" => {
                    // serde's message would quote the value: it may be a credential.
                    let raw: BTreeMap<String, String> = map.next_value().map_err(|_| {
                        ctx.fail(format!(
                            "key `headers` {place} takes a map of header names to text \
                             (`Authorization: \"Bearer ${{TOKEN}}\"`)"
                        ))
                    })?;
                    for (k, v) in raw {
                        if headers
                            .iter()
                            .any(|(o, _): &(String, Secret)| o.eq_ignore_ascii_case(&k))
                        {
                            return Err(ctx.fail(format!(
                                "header {k:?} is given twice {place} (header names ignore case)"
                            )));
                        }
                        let valid = reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_ok()
                            && reqwest::header::HeaderValue::from_str(&v).is_ok();
                        if !valid {
                            // The value is never echoed: it may be a credential.
                            return Err(ctx.fail(format!(
                                "header {k:?} {place} is not a valid HTTP header name and value"
                            )));
                        }
                        headers.push((k, Secret(v)));
                    }
                }
                _ => {
                    let raw: Vec<String> = map.next_value().map_err(|e| {
                        ctx.fail(format!("key `events` {place} takes a list of names ({e})"))
                    })?;
                    events = raw
                        .iter()
                        .map(|n| NotifyEvent::parse(n))
                        .collect::<Result<_, _>>()
                        .map_err(|m| ctx.fail(format!("{m} (key `events` {place})")))?;
                    if events.is_empty() {
                        return Err(ctx.fail(format!(
                            "key `events` {place} is empty: leave it out to send every event"
                        )));
                    }
                }
            }
        }
        let Some(url) = url else {
            return Err(ctx.fail(format!("missing key `url` {place}")));
        };
        let named = name.is_some();
        let name = name.unwrap_or_else(|| format!("webhook-{}", self.index));
        if self.taken.iter().any(|o| o.name == name) {
            return Err(ctx.fail(format!(
                "two webhooks are named {name:?} in notify.webhooks: names must differ ({})",
                if named {
                    format!("key `name` {place}")
                } else {
                    format!("the default name of the entry {place}: give it a `name`")
                }
            )));
        }
        Ok(WebhookConfig {
            name,
            url,
            headers,
            events,
            timeout,
            retries: tries,
        })
    }
}
