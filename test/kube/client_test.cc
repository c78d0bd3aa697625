#include "kube/client.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/kube/fakes.h"
#include "test/support/temp_dir.h"

namespace rdp::kube {
namespace {

using ::rdp::kube::testing::Env;
using ::rdp::kube::testing::FakeClock;
using ::rdp::kube::testing::FuncTransport;
using ::rdp::kube::testing::Json;
using ::rdp::kube::testing::ServiceAccount;
using ::rdp::kube::testing::StatusBody;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::trunc) << content;
}

// A client over a FuncTransport and a fake clock; `requests` sees every exchange.
struct Harness {
  explicit Harness(FuncTransport::Handler handler, Config config = {}) {
    if (config.server.empty()) config.server = "https://api.test:6443";
    if (config.token.empty() && config.token_file.empty()) config.token = "t0k3n";
    auto transport = std::make_unique<FuncTransport>(std::move(handler));
    requests = transport->requests;
    Client::Options options;
    options.clock = &clock;
    options.jitter_seed = 42;
    client = std::make_unique<Client>(config, std::move(transport), options);
  }
  absl::Time Deadline(absl::Duration d) { return clock.Now() + d; }

  FakeClock clock;
  std::shared_ptr<std::vector<HttpRequest>> requests;
  std::unique_ptr<Client> client;
};

TEST(KubeClientTest, SendsTheRequestAndParsesTheAnswer) {
  Harness h([](const HttpRequest&) { return Json(201, {{"kind", "ResourceSlice"}}); });
  auto r = h.client->Post("/apis/x", {{"a", 1}}, h.Deadline(absl::Seconds(5)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body["kind"], "ResourceSlice");
  ASSERT_EQ(h.requests->size(), 1u);
  const HttpRequest& sent = h.requests->front();
  EXPECT_EQ(sent.method, "POST");
  EXPECT_EQ(sent.url, "https://api.test:6443/apis/x");
  EXPECT_EQ(nlohmann::json::parse(sent.body), nlohmann::json({{"a", 1}}));
  EXPECT_THAT(sent.headers, ::testing::Contains("Authorization: Bearer t0k3n"));
  EXPECT_THAT(sent.headers, ::testing::Contains("Content-Type: application/json"));
  EXPECT_EQ(sent.timeout, absl::Seconds(5));
}

// A string that is not UTF-8 (a name read from sysfs) in a body is sent, with U+FFFD in its
// place, rather than make dump() throw on the publishing thread (which ended the process).
TEST(KubeClientTest, ABodyThatIsNotUtf8IsSentNotThrown) {
  Harness h([](const HttpRequest&) { return Json(201, {{"kind", "ResourceSlice"}}); });
  absl::StatusOr<Response> r = absl::UnknownError("not sent");
  EXPECT_NO_THROW(r = h.client->Post("/apis/x", {{"name", std::string("mlx5_\xff")}},
                                     h.Deadline(absl::Seconds(5))));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(h.requests->size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(h.requests->front().body)["name"], "mlx5_\xef\xbf\xbd");
}

TEST(KubeClientTest, MapsStatusCodes) {
  struct Case {
    std::string method;
    int code;
    std::string reason;
    absl::StatusCode want;
  };
  const std::vector<Case> cases = {
      {"GET", 400, "BadRequest", absl::StatusCode::kInvalidArgument},
      {"GET", 401, "Unauthorized", absl::StatusCode::kPermissionDenied},
      {"GET", 403, "Forbidden", absl::StatusCode::kPermissionDenied},
      {"GET", 404, "NotFound", absl::StatusCode::kNotFound},
      {"POST", 409, "AlreadyExists", absl::StatusCode::kAlreadyExists},
      {"PUT", 409, "Conflict", absl::StatusCode::kAborted},
      {"DELETE", 409, "Conflict", absl::StatusCode::kAborted},
      {"GET", 410, "Expired", absl::StatusCode::kAborted},
      {"POST", 422, "Invalid", absl::StatusCode::kInvalidArgument},
      {"GET", 501, "NotImplemented", absl::StatusCode::kUnknown},
      {"GET", 302, "", absl::StatusCode::kUnknown},
  };
  for (const Case& c : cases) {
    Harness h([&](const HttpRequest&) {
      return StatusBody(c.code, c.reason, "because " + c.reason);
    });
    auto r = h.client->Do(c.method, "/p", nullptr, h.Deadline(absl::Seconds(5)));
    EXPECT_EQ(r.status().code(), c.want) << c.method << " " << c.code << ": " << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.method + " /p: " + std::to_string(c.code)));
    EXPECT_THAT(r.status().message(), HasSubstr("because " + c.reason)) << "the server's message";
    EXPECT_EQ(h.requests->size(), 1u) << c.code << " is not retried";
  }
}

TEST(KubeClientTest, ConflictWithoutReasonDependsOnTheMethod) {
  Harness h([](const HttpRequest&) { return HttpResponse{409, "", std::nullopt}; });
  EXPECT_TRUE(
      absl::IsAlreadyExists(h.client->Post("/p", {}, h.Deadline(absl::Seconds(1))).status()));
  EXPECT_TRUE(absl::IsAborted(h.client->Put("/p", {}, h.Deadline(absl::Seconds(1))).status()));
}

TEST(KubeClientTest, RetriesUnavailableWithGrowingJitteredBackoff) {
  int calls = 0;
  Harness h([&](const HttpRequest&) -> absl::StatusOr<HttpResponse> {
    if (++calls <= 4) return absl::UnavailableError("connection refused");
    return Json(200, {{"ok", true}});
  });
  auto r = h.client->Get("/p", h.Deadline(absl::Seconds(30)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 5);
  ASSERT_EQ(h.clock.sleeps.size(), 4u);
  absl::Duration bound = absl::Milliseconds(200);
  for (absl::Duration slept : h.clock.sleeps) {
    EXPECT_GE(slept, bound / 2);
    EXPECT_LE(slept, bound);
    bound *= 2;
  }
}

TEST(KubeClientTest, RetriesTooManyRequestsAndServerErrorsHonouringRetryAfter) {
  std::vector<HttpResponse> answers = {StatusBody(429, "TooManyRequests", "slow down"),
                                       StatusBody(503, "ServiceUnavailable", "etcd"),
                                       StatusBody(500, "InternalError", "oops"),
                                       Json(200, {})};
  answers[0].retry_after = absl::Seconds(3);
  std::size_t next = 0;
  Harness h([&](const HttpRequest&) { return answers[next++]; });
  auto r = h.client->Get("/p", h.Deadline(absl::Seconds(30)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(next, 4u);
  ASSERT_EQ(h.clock.sleeps.size(), 3u);
  EXPECT_EQ(h.clock.sleeps[0], absl::Seconds(3)) << "Retry-After beats a shorter back-off";
}

TEST(KubeClientTest, StopsRetryingAtTheDeadlineAndEachAttemptGetsTheTimeLeft) {
  Harness* self = nullptr;
  Harness h([&](const HttpRequest&) -> absl::StatusOr<HttpResponse> {
    self->clock.Advance(absl::Milliseconds(300));  // each attempt takes a while
    return absl::UnavailableError("connection refused");
  });
  self = &h;
  const absl::Time start = h.clock.Now();
  const absl::Time deadline = h.Deadline(absl::Seconds(4));
  auto r = h.client->Get("/p", deadline);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("connection refused"));
  EXPECT_THAT(r.status().message(), HasSubstr("attempts"));
  EXPECT_LE(h.clock.Now(), deadline) << "no wait ends past the deadline";
  ASSERT_GE(h.requests->size(), 3u);
  absl::Time at = start;
  for (std::size_t i = 0; i < h.requests->size(); ++i) {
    EXPECT_LE((*h.requests)[i].timeout, deadline - at) << "attempt " << i;
    EXPECT_GT((*h.requests)[i].timeout, absl::ZeroDuration());
    at += absl::Milliseconds(300);
    if (i < h.clock.sleeps.size()) at += h.clock.sleeps[i];
  }
}

TEST(KubeClientTest, TransportTimeoutIsDeadlineExceededAndNotRetried) {
  Harness h([](const HttpRequest&) -> absl::StatusOr<HttpResponse> {
    return absl::DeadlineExceededError("Timeout was reached");
  });
  auto r = h.client->Get("/p", h.Deadline(absl::Seconds(2)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("GET /p"));
  EXPECT_EQ(h.requests->size(), 1u);
}

TEST(KubeClientTest, PassedDeadlineSendsNothing) {
  Harness h([](const HttpRequest&) { return Json(200, {}); });
  auto r = h.client->Get("/p", h.clock.Now());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_TRUE(h.requests->empty());
}

// A proxy's or a portal's page in place of the API server's answer: the message says what came.
TEST(KubeClientTest, BodyThatIsNotJsonIsAnErrorNamingItsContentType) {
  Harness h([](const HttpRequest&) {
    return HttpResponse{200, "<html>", std::nullopt, "text/html; charset=utf-8"};
  });
  const absl::Status s = h.client->Get("/p", h.Deadline(absl::Seconds(1))).status();
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("GET /p: 200 with a body that is not JSON"));
  EXPECT_THAT(s.message(), HasSubstr("(Content-Type: text/html; charset=utf-8)"));
  Harness none([](const HttpRequest&) { return HttpResponse{200, "<html>", std::nullopt, ""}; });
  EXPECT_THAT(none.client->Get("/p", none.Deadline(absl::Seconds(1))).status().message(),
              HasSubstr("(Content-Type: none)"));
}

TEST(KubeClientTest, RereadsTheTokenFileWhenItRotates) {
  rdp::testing::TempDir dir;
  const std::string token = dir.Sub("token");
  WriteFile(token, "first\n");
  Config config;
  config.token_file = token;
  Harness h([](const HttpRequest&) { return Json(200, {}); }, config);
  auto bearer = [&] {
    EXPECT_TRUE(h.client->Get("/p", h.Deadline(absl::Seconds(1))).ok());
    for (const auto& header : h.requests->back().headers) {
      if (header.rfind("Authorization: ", 0) == 0) return header;
    }
    return std::string("(none)");
  };
  EXPECT_EQ(bearer(), "Authorization: Bearer first");
  WriteFile(token + ".new", "second");
  ASSERT_EQ(std::rename((token + ".new").c_str(), token.c_str()), 0);  // as the kubelet swaps it
  EXPECT_EQ(bearer(), "Authorization: Bearer second");
  std::remove(token.c_str());
  EXPECT_EQ(bearer(), "Authorization: Bearer second") << "the last token outlives a missing file";
}

TEST(KubeClientTest, MissingTokenFileFromTheStartIsUnauthenticated) {
  Config config;
  config.token_file = "/nonexistent/token";
  Harness h([](const HttpRequest&) { return Json(200, {}); }, config);
  auto r = h.client->Get("/p", h.Deadline(absl::Seconds(1)));
  EXPECT_TRUE(absl::IsUnauthenticated(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/token"));
  EXPECT_TRUE(h.requests->empty());
}

TEST(KubeClientTest, ConcurrentRequestsShareOneClient) {
  rdp::testing::TempDir dir;
  WriteFile(dir.Sub("token"), "shared");
  Config config;
  config.server = "https://api.test";
  config.token_file = dir.Sub("token");
  std::atomic<int> calls{0};
  auto transport = std::make_unique<FuncTransport>(
      [&](const HttpRequest& r) -> absl::StatusOr<HttpResponse> {
        // Each request's first attempt fails (a thread's attempts are sequential), so that
        // the back-off's random draws race too.
        thread_local int attempts = 0;
        calls.fetch_add(1);
        if (attempts++ % 2 == 0) return absl::UnavailableError("reset");
        const bool bearer = std::find(r.headers.begin(), r.headers.end(),
                                      "Authorization: Bearer shared") != r.headers.end();
        return Json(200, {{"bearer", bearer}});
      });
  Client::Options options;
  options.retry.initial = absl::Microseconds(10);  // the real clock: keep the waits tiny
  options.retry.max = absl::Microseconds(100);
  Client client(config, std::move(transport), options);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto r = client.Get("/p", absl::Now() + absl::Seconds(10));
        if (r.ok() && r->body["bearer"] == true) {
          ++ok;
        } else {
          ADD_FAILURE() << (r.ok() ? r->body.dump() : r.status().ToString());
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok.load(), 200);
  EXPECT_EQ(calls.load(), 400);
}

// Shutdown (the process stopping) ends a call that waits out an unreachable API server at once:
// the retry's wait ends, no attempt follows, the answer is Cancelled naming the stop; a call made
// after it sends nothing, and an exchange in progress is told to give up (its `cancelled`).
TEST(KubeClientTest, ShutdownEndsCallsInFlightAndRefusesNewOnes) {
  absl::Mutex mu;
  absl::CondVar attempted;
  int attempts = 0;
  std::function<bool()> cancelled;  // the last exchange's
  auto transport = std::make_unique<FuncTransport>(
      [&](const HttpRequest& r) -> absl::StatusOr<HttpResponse> {
        absl::MutexLock lock(&mu);
        ++attempts;
        cancelled = r.cancelled;
        attempted.SignalAll();
        return absl::UnavailableError("connection refused");
      });
  Config config;
  config.server = "https://api.test";
  config.token = "t";
  Client::Options options;  // the real clock: Shutdown ends its waits
  options.retry.initial = absl::Seconds(30);  // one wait would outlast the test's timeout
  options.retry.max = absl::Seconds(30);
  Client client(config, std::move(transport), options);
  absl::Status got;
  std::thread call([&] { got = client.Get("/p", absl::Now() + absl::Minutes(10)).status(); });
  {
    absl::MutexLock lock(&mu);
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (attempts < 1) {
      if (attempted.WaitWithDeadline(&mu, until)) break;
    }
    ASSERT_EQ(attempts, 1);
    ASSERT_TRUE(cancelled != nullptr);
    EXPECT_FALSE(cancelled());
  }
  client.Shutdown();  // the call is in its 15-30 s wait now, or about to be
  call.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kCancelled) << got;
  EXPECT_THAT(got.message(), HasSubstr("the client is shut down"));
  EXPECT_THAT(got.message(), HasSubstr("connection refused"));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(attempts, 1);
    EXPECT_TRUE(cancelled());  // an exchange still running would stop at its next poll
  }
  const absl::Status after = client.Get("/p", absl::Now() + absl::Minutes(1)).status();
  EXPECT_EQ(after.code(), absl::StatusCode::kCancelled) << after;
  absl::MutexLock lock(&mu);
  EXPECT_EQ(attempts, 1);
}

// Shutdown ends a retry's wait on any clock, a test's too: the wait it ends takes none of the
// clock's time, and no attempt follows it.
TEST(KubeClientTest, ShutdownEndsAWaitOnTheClientsOwnClock) {
  FakeClock clock;
  Client* client_ptr = nullptr;
  int attempts = 0;
  auto transport = std::make_unique<FuncTransport>(
      [&](const HttpRequest&) -> absl::StatusOr<HttpResponse> {
        if (++attempts == 2) client_ptr->Shutdown();  // the stop comes during the second try
        return absl::UnavailableError("connection refused");
      });
  Config config;
  config.server = "https://api.test";
  config.token = "t";
  Client::Options options;
  options.clock = &clock;
  Client client(config, std::move(transport), options);
  client_ptr = &client;
  const absl::Time start = clock.Now();
  const absl::Status got = client.Get("/p", start + absl::Minutes(10)).status();
  EXPECT_EQ(got.code(), absl::StatusCode::kCancelled) << got;
  EXPECT_EQ(attempts, 2);
  ASSERT_EQ(clock.sleeps.size(), 1u);  // the wait after the first try only
  EXPECT_EQ(clock.Now(), start + clock.sleeps[0]);
}

TEST(KubeClientTest, PercentEncodesQueryValues) {
  EXPECT_EQ(PercentEncode("spec.nodeName=n-1,spec.driver=a.b_c~"),
            "spec.nodeName%3Dn-1%2Cspec.driver%3Da.b_c~");
}

// A watch: events split across reads, each delivered once whole; the server ending the watch
// (its timeoutSeconds) is OK; on_open once the server accepted it.
TEST(KubeClientTest, WatchDeliversEachEventAcrossReads) {
  FuncTransport* t = new FuncTransport([](const HttpRequest&) { return Json(200, {}); });
  t->stream_handler = [](const HttpRequest& request, const std::function<void(int)>& on_open,
                         const std::function<bool(std::string_view)>& on_data)
      -> absl::StatusOr<HttpResponse> {
    on_open(200);
    const std::string a = R"({"type":"ADDED","object":{"metadata":{"name":"s1"}}})";
    const std::string b = R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"7"}}})";
    const std::string stream = a + "\n" + b + "\n";
    if (!on_data(std::string_view(stream).substr(0, 20))) return absl::CancelledError("x");
    if (!on_data(std::string_view(stream).substr(20, a.size()))) return absl::CancelledError("x");
    if (!on_data(std::string_view(stream).substr(20 + a.size()))) return absl::CancelledError("x");
    HttpResponse r;
    r.status = 200;
    (void)request;
    return r;
  };
  auto requests = t->requests;
  Client client(Config{"https://api.test:6443", "", "", "", false, "t0k3n"},
                    std::unique_ptr<Transport>(t));
  int opened = 0;
  std::vector<nlohmann::json> events;
  absl::Status s = client.Watch(
      "/apis/x?watch=true", absl::Minutes(10), [] { return false; }, [&] { ++opened; },
      [&](const nlohmann::json& e) {
        events.push_back(e);
        return true;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(opened, 1);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["type"], "ADDED");
  EXPECT_EQ(events[0]["object"]["metadata"]["name"], "s1");
  EXPECT_EQ(events[1]["type"], "BOOKMARK");
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ(requests->front().url, "https://api.test:6443/apis/x?watch=true");
  EXPECT_EQ(requests->front().timeout, absl::Minutes(10));
  EXPECT_THAT(requests->front().headers, ::testing::Contains("Authorization: Bearer t0k3n"));
}

// An ERROR event with 410 Gone (the version is too old) is Aborted: list again; a refused watch
// is the table's status with the server's message.
TEST(KubeClientTest, WatchErrorsAreStatuses) {
  auto run = [](FuncTransport::StreamHandler handler) {
    auto* t = new FuncTransport([](const HttpRequest&) { return Json(200, {}); });
    t->stream_handler = std::move(handler);
    Client client(Config{"https://api.test:6443"}, std::unique_ptr<Transport>(t));
    return client.Watch("/apis/x", absl::Minutes(1), nullptr, nullptr,
                        [](const nlohmann::json&) { return true; });
  };
  absl::Status gone = run([](const HttpRequest&, const std::function<void(int)>& on_open,
                             const std::function<bool(std::string_view)>& on_data)
                              -> absl::StatusOr<HttpResponse> {
    on_open(200);
    const std::string e =
        R"j({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 5 (90)"}})j"
        "\n";
    if (on_data(e)) return absl::InternalError("the reader should have stopped");
    return absl::CancelledError("stopped");
  });
  EXPECT_TRUE(absl::IsAborted(gone)) << gone;
  EXPECT_THAT(gone.message(), HasSubstr("too old resource version"));
  absl::Status refused = run([](const HttpRequest&, const std::function<void(int)>& on_open,
                                const std::function<bool(std::string_view)>&)
                                 -> absl::StatusOr<HttpResponse> {
    on_open(403);
    return StatusBody(403, "Forbidden", "cannot watch resourceslices");
  });
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("cannot watch resourceslices"));
  absl::Status down = run([](const HttpRequest&, const std::function<void(int)>&,
                             const std::function<bool(std::string_view)>&)
                              -> absl::StatusOr<HttpResponse> {
    return absl::UnavailableError("connection reset");
  });
  EXPECT_TRUE(absl::IsUnavailable(down)) << down;
}

// A bearer token is never sent to a plain http:// server (anyone on the path would read it).
TEST(KubeClientTest, PlainHttpServerGetsNoToken) {
  Config config;
  config.server = "http://api.test:8080";
  config.token = "t0k3n";
  Harness h([](const HttpRequest&) { return Json(200, {}); }, config);
  auto r = h.client->Get("/api/v1/nodes/n", h.Deadline(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("in clear"));
  EXPECT_TRUE(h.requests->empty());
  EXPECT_FALSE(CheckCredentialsSafe(config).ok());
  config.server = "https://api.test:8080";
  EXPECT_TRUE(CheckCredentialsSafe(config).ok());
}

// A kubeconfig whose one context is `server` with a token.
std::string TokenKubeconfig(const std::string& server) {
  return nlohmann::json{
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"current-context", "c"},
      {"contexts", {{{"name", "c"}, {"context", {{"cluster", "k"}, {"user", "u"}}}}}},
      {"clusters", {{{"name", "k"}, {"cluster", {{"server", server}}}}}},
      {"users", {{{"name", "u"}, {"user", {{"token", "t0k3n"}}}}}}}
      .dump();
}

TEST(KubeClientTest, NewClientReadsTheKubeconfigGivenAndNotTheServiceAccount) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("kubeconfig");
  WriteFile(path, TokenKubeconfig("https://api.test:6443"));
  auto client = NewClient(path, dir.Sub("no-root"),
                          Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                               {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->config().server, "https://api.test:6443");
  EXPECT_EQ((*client)->config().source, "kubeconfig " + path);

  auto missing = NewClient(dir.Sub("missing"), dir.Sub("no-root"), Env({}));
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.Sub("missing")));
}

TEST(KubeClientTest, NewClientWithoutAKubeconfigUsesTheServiceAccount) {
  rdp::testing::TempDir root;
  const std::string sa = ServiceAccount(root.path());
  auto client = NewClient("", root.path(),
                          Env({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                               {"KUBERNETES_SERVICE_PORT", "443"}}));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->config().server, "https://10.96.0.1:443");
  EXPECT_EQ((*client)->config().token_file, sa + "/token");

  auto outside = NewClient("", root.path(), Env({}));
  EXPECT_TRUE(absl::IsFailedPrecondition(outside.status())) << outside.status();
  EXPECT_THAT(outside.status().message(), HasSubstr("KUBERNETES_SERVICE_HOST"));
}

TEST(KubeClientTest, NewClientRefusesAKubeconfigThatWouldSendItsTokenInClear) {
  rdp::testing::TempDir dir;
  const std::string path = dir.Sub("kubeconfig");
  WriteFile(path, TokenKubeconfig("http://api.test:8080"));
  auto client = NewClient(path, dir.Sub("no-root"), Env({}));
  EXPECT_TRUE(absl::IsFailedPrecondition(client.status())) << client.status();
  EXPECT_THAT(client.status().message(), HasSubstr("in clear"));
  EXPECT_THAT(client.status().message(), HasSubstr("kubeconfig " + path));
}

}  // namespace
}  // namespace rdp::kube
