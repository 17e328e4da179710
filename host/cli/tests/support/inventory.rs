//! The `shop.v1.Inventory` server of `tests/data/grpc/shop.proto`, shared by the test binaries that
//! call it (`tests/it/grpc.rs`, `tests/kafka.rs`): a real tonic server with hand-written prost messages
//! (an encoding independent of the host's dynamic one), recording what it saw in a [`Seen`].
//! `tests/kafka.rs` includes it with `#[path = "support/inventory.rs"] mod inventory;`, `tests/it` as
//! `support::inventory`.

// Each test binary uses a different part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct GetItemRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(bool, tag = "2")]
    with_tags: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Item {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(int32, tag = "3")]
    quantity: i32,
    #[prost(string, repeated, tag = "4")]
    tags: Vec<String>,
    /// `Kind`, an enum: an int32 on the wire.
    #[prost(int32, tag = "5")]
    kind: i32,
    #[prost(int64, tag = "6")]
    price_cents: i64,
    #[prost(message, optional, tag = "7")]
    updated: Option<prost_types::Timestamp>,
    #[prost(string, tag = "8")]
    caller: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ReserveRequest {
    #[prost(string, tag = "1")]
    item_id: String,
    #[prost(int32, tag = "2")]
    quantity: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Reservation {
    #[prost(string, tag = "1")]
    idempotency_key: String,
    #[prost(uint32, tag = "2")]
    attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SlowRequest {
    #[prost(uint32, tag = "1")]
    millis: u32,
}

/// A prost codec: encodes `E`, decodes `D`.
struct Prost<E, D>(PhantomData<fn() -> (E, D)>);

impl<E, D> Prost<E, D> {
    fn new() -> Self {
        Prost(PhantomData)
    }
}

impl<E: prost::Message + Send + 'static, D: prost::Message + Default + Send + 'static> Codec for Prost<E, D> {
    type Encode = E;
    type Decode = D;
    type Encoder = Prost<E, D>;
    type Decoder = Prost<E, D>;

    fn encoder(&mut self) -> Self::Encoder {
        Prost::new()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Prost::new()
    }
}

impl<E: prost::Message, D> Encoder for Prost<E, D> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

impl<E, D: prost::Message + Default> Decoder for Prost<E, D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

/// What the server saw: idempotency keys of `Reserve`, of `Slow` (kept apart, so that `Slow` calls
/// do not count as `Reserve` attempts), and peers of every call.
#[derive(Clone, Default)]
pub struct Seen {
    keys: Arc<Mutex<Vec<String>>>,
    slow_keys: Arc<Mutex<Vec<String>>>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
}

impl Seen {
    /// The idempotency keys of `Reserve` calls, in order.
    pub fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }

    /// The idempotency keys of `Slow` calls, in the order they arrived (before their answer).
    pub fn slow_keys(&self) -> Vec<String> {
        self.slow_keys.lock().unwrap().clone()
    }

    pub fn peers(&self) -> BTreeSet<SocketAddr> {
        self.peers.lock().unwrap().iter().copied().collect()
    }
}

/// `shop.v1.Inventory`, routed by path as tonic-build's generated servers do.
#[derive(Clone)]
pub struct Inventory(pub Seen);

impl tonic::server::NamedService for Inventory {
    const NAME: &'static str = "shop.v1.Inventory";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn get_item(req: Request<GetItemRequest>) -> BoxFuture<Result<Response<Item>, Status>> {
    let authorization = req
        .metadata()
        .get("authorization")
        .map(|v| v.to_str().unwrap_or("").to_string());
    let r = req.into_inner();
    Box::pin(async move {
        let caller = match authorization.as_deref() {
            None => "",
            Some("Bearer s3cret") => "authenticated",
            Some(_) => return Err(Status::unauthenticated("wrong token")),
        };
        if !r.id.starts_with("sku-") {
            return Err(Status::not_found(format!("no item {}", r.id)));
        }
        Ok(Response::new(Item {
            id: r.id,
            name: "Hammer".into(),
            quantity: 3,
            tags: if r.with_tags {
                vec!["tool".into(), "steel".into()]
            } else {
                vec![]
            },
            kind: 1,
            price_cents: 1299,
            updated: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            caller: caller.into(),
        }))
    })
}

impl tower::Service<http::Request<tonic::body::Body>> for Inventory {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let seen = self.0.clone();
        if let Some(peer) = req
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
        {
            seen.peers.lock().unwrap().push(peer);
        }
        Box::pin(async move {
            let path = req.uri().path().to_string();
            Ok(match path.as_str() {
                "/shop.v1.Inventory/GetItem" => {
                    tonic::server::Grpc::new(Prost::<Item, GetItemRequest>::new())
                        .unary(tower::service_fn(get_item), req)
                        .await
                }
                "/shop.v1.Inventory/Reserve" => {
                    let reserve = move |r: Request<ReserveRequest>| {
                        let key = r
                            .metadata()
                            .get("idempotency-key")
                            .map(|v| v.to_str().unwrap_or("").to_string())
                            .unwrap_or_default();
                        let mut keys = seen.keys.lock().unwrap();
                        keys.push(key.clone());
                        let attempt = keys.len() as u32;
                        async move {
                            if attempt == 1 {
                                return Err(Status::unavailable("warming up"));
                            }
                            Ok(Response::new(Reservation {
                                idempotency_key: key,
                                attempt,
                            }))
                        }
                    };
                    tonic::server::Grpc::new(Prost::<Reservation, ReserveRequest>::new())
                        .unary(tower::service_fn(reserve), req)
                        .await
                }
                "/shop.v1.Inventory/Slow" => {
                    let slow = move |r: Request<SlowRequest>| {
                        if let Some(key) = r.metadata().get("idempotency-key") {
                            let key = key.to_str().unwrap_or("").to_string();
                            seen.slow_keys.lock().unwrap().push(key);
                        }
                        async move {
                            tokio::time::sleep(Duration::from_millis(r.into_inner().millis.into())).await;
                            Ok::<_, Status>(Response::new(Item {
                                id: "slow".into(),
                                ..Item::default()
                            }))
                        }
                    };
                    tonic::server::Grpc::new(Prost::<Item, SlowRequest>::new())
                        .unary(tower::service_fn(slow), req)
                        .await
                }
                _ => Status::unimplemented(format!("no method {path}")).into_http(),
            })
        })
    }
}

/// Starts the inventory server on a free port in a background thread; returns its URL.
pub fn server(seen: Seen) -> String {
    format!("http://{}", serve(seen, None))
}

/// Starts the inventory server on a free port in a background thread, over TLS when `tls` is
/// given; returns its address.
pub fn serve(seen: Seen, tls: Option<tonic::transport::ServerTlsConfig>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                builder = builder.tls_config(tls).unwrap();
            }
            builder
                .add_service(Inventory(seen))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}
