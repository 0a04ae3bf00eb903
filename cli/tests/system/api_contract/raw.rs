//! [`RawGrpc`]: the contract's calls as plain gRPC calls to one node, as a
//! client written in any other language makes them: one call per request, no
//! retry, no failover to another node, no leader hint followed. Only a whole
//! listing is gathered page by page (the one paging loop, `whole_listing`),
//! as the trait asks; `list_page` is one call.
//!
//! Errors are read off the wire with the one status mapping
//! (`ApiError::from_status`) and given the outcome the client's decision table
//! gives a final answer, so the checks compare the same `ClientError`s
//! whichever implementation they run through.

use std::sync::Arc;
use std::time::Duration;

use cairn_client::api::{whole_listing, ApiFuture, Event, Listing, ResourceApi, Watch};
use cairn_client::{Access, AuthenticatedChannel, ClientError, WatchProgress};
use cairn_proto::error::ApiError;
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::*;
use cairn_request::Operation;
use tonic::metadata::MetadataMap;
use tonic::service::interceptor::InterceptedService;

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One node's client port, reached with an [`Access`] (TLS, a token).
#[derive(Clone)]
pub struct RawGrpc {
    address: String,
    channel: AuthenticatedChannel,
}

impl RawGrpc {
    /// The node at `address`, every call made with `access` (connected on first use).
    pub fn new(access: &Access, address: &str) -> RawGrpc {
        let endpoint = access
            .endpoint(address)
            .expect("a node address")
            .timeout(CALL_TIMEOUT);
        let channel =
            cairn_tls::lazy_channel(endpoint, access.tls.as_ref(), Duration::from_millis(500));
        RawGrpc {
            address: address.to_string(),
            channel: InterceptedService::new(channel, access.credentials.clone()),
        }
    }

    fn grpc(&self) -> ResourceServiceClient<AuthenticatedChannel> {
        ResourceServiceClient::new(self.channel.clone())
    }

    /// A read at any revision (the trait reads the latest only).
    pub async fn read_request(&self, request: ReadRequest) -> Result<ReadResponse, ClientError> {
        answer(Operation::Read, self.grpc().read(request).await)
    }

    /// One list call, as sent.
    pub async fn list_request(&self, request: ListRequest) -> Result<ListResponse, ClientError> {
        answer(Operation::Read, self.grpc().list(request).await)
    }

    /// Opens a watch, as sent.
    pub async fn watch_request(&self, request: WatchListRequest) -> Result<Watch, ClientError> {
        let response = self.grpc().watch_list(request).await;
        let response = response.map_err(|s| error_of(Operation::Read, &s))?;
        let watch_id = header(response.metadata(), cairn_proto::WATCH_ID_HEADER)
            .and_then(|id| id.parse().ok());
        let cluster_id = header(response.metadata(), cairn_proto::CLUSTER_ID_HEADER);
        let events = futures::stream::unfold(Some(response.into_inner()), |state| async move {
            let mut stream = state?;
            loop {
                match stream.message().await {
                    Ok(Some(event)) => match Event::from_wire(event) {
                        Ok(Some(event)) => return Some((Ok(event), Some(stream))),
                        Ok(None) => continue,
                        Err(e) => return Some((Err(e), None)),
                    },
                    Ok(None) => return None,
                    Err(status) => return Some((Err(error_of(Operation::Read, &status)), None)),
                }
            }
        });
        Ok(Watch::new(
            self.address.clone(),
            watch_id,
            cluster_id,
            events,
        ))
    }
}

fn header(metadata: &MetadataMap, key: &str) -> Option<String> {
    metadata
        .get(key)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn error_of(operation: Operation, status: &tonic::Status) -> ClientError {
    ClientError::from_node_answer(ApiError::from_status(status), operation)
}

fn answer<T>(
    operation: Operation,
    result: Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, ClientError> {
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| error_of(operation, &status))
}

/// The resource an answer to `operation` must carry.
fn carried(operation: Operation, resource: Option<Resource>) -> Result<Arc<Resource>, ClientError> {
    resource.map(Arc::new).ok_or_else(|| {
        let missing = ApiError::Internal("the answer carries no resource".into());
        ClientError::from_node_answer(missing, operation)
    })
}

impl ResourceApi for RawGrpc {
    fn read(&self, id: Id, consistency: Consistency) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let request = ReadRequest {
                id: Some(id),
                consistency: consistency as i32,
                ..ReadRequest::default()
            };
            carried(Operation::Read, self.read_request(request).await?.resource)
        })
    }

    fn write(&self, resource: Resource) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let request = WriteRequest {
                fence: None,
                resource: Some(resource),
            };
            let written = answer(Operation::Mutation, self.grpc().write(request).await)?;
            carried(Operation::Mutation, written.resource)
        })
    }

    fn delete_request(&self, request: DeleteRequest) -> ApiFuture<'_, DeleteResponse> {
        Box::pin(async move { answer(Operation::Mutation, self.grpc().delete(request).await) })
    }

    fn write_status(&self, request: WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let written = answer(Operation::Mutation, self.grpc().write_status(request).await)?;
            carried(Operation::Mutation, written.resource)
        })
    }

    fn list(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
            let listing = whole_listing(&request, deadline, |page, _| async move {
                Ok(Listing::from(self.list_request(page).await?))
            })
            .await?;
            Ok(listing.shared())
        })
    }

    fn list_page(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(async move { Ok(Listing::from(self.list_request(request).await?).shared()) })
    }

    fn list_by_owner(&self, owner: Id) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let request = ListByOwnerRequest { owner: Some(owner) };
            let owned = answer(Operation::Read, self.grpc().list_by_owner(request).await)?;
            Ok(Listing {
                resources: owned.resources.into_iter().map(Arc::new).collect(),
                revision: owned.revision,
                next_page_token: String::new(),
            })
        })
    }

    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, Watch> {
        Box::pin(self.watch_request(request))
    }

    fn watch_progress(&self, _source: &str, watch_ids: Vec<u64>) -> ApiFuture<'_, WatchProgress> {
        Box::pin(async move {
            let request = WatchProgressRequest { watch_ids };
            let response = self.grpc().watch_progress(request).await;
            let response = response.map_err(|s| error_of(Operation::Read, &s))?;
            Ok(WatchProgress::from(response))
        })
    }

    fn avoid(&self, _source: &str) {
        // One node only: there is nowhere else to go.
    }
}
