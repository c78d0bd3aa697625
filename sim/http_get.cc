#include "sim/http_get.h"

#include <curl/curl.h>

namespace rdp::sim {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

HttpResponse HttpGet(const std::string& url, absl::Duration timeout) {
  HttpResponse r;
  CURL* curl = curl_easy_init();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.code);
    char* type = nullptr;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
    if (type) r.content_type = type;
  }
  curl_easy_cleanup(curl);
  return r;
}

}  // namespace rdp::sim
