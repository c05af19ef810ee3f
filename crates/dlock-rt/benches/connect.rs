//! Fresh-connection requests per second to one no-op route, by how the client names the
//! server: an IP address (the baseline: nothing to resolve), a host name as deployments
//! write it (`http://lock-server:8081`; here `localhost`), and the same name looked up
//! before every request, as every fresh connection did before the client kept a name's
//! addresses (`dlock_rt::http` resolve, issue 14). Prints each row's ratio to the baseline
//! measured in the same run. Here the name resolves from `/etc/hosts`; in a cluster each
//! lookup is a DNS query, so the last row is the cheapest it gets.
//!
//! `cargo bench -p dlock-rt --bench connect`; `DLOCK_BENCH_N` requests per row (default
//! 2000), three alternated rounds, the median of each row.
#![allow(clippy::disallowed_methods, reason = "a benchmark times itself on the host's clock, outside the services")]

#[cfg(madsim)]
fn main() {}

#[cfg(not(madsim))]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(bench::run());
}

#[cfg(not(madsim))]
mod bench {
    // Real wall-clock time on purpose: a bench measures the real machine, and benches are
    // built only outside the simulation (`cfg(not(madsim))`), so no seam is bypassed.
    use std::time::Instant;

    use dlock_rt::http::{BaseUrl, HttpClient};

    pub async fn run() {
        let n = dlock_testkit::bench::env_usize("DLOCK_BENCH_N", 2_000);
        let router = axum::Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(dlock_rt::http::serve(listener, router, std::future::pending()));
        let by_ip = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).expect("url");
        let by_name = BaseUrl::parse(&format!("http://localhost:{port}")).expect("url");
        let client = HttpClient::new(1_000, 5_000);
        let mut rows: [Vec<f64>; 3] = Default::default();
        for _ in 0..3 {
            rows[0].push(rate(n, || async { client.send(&by_ip, http::Method::GET, "/ok", &[], None).await }).await);
            rows[1].push(rate(n, || async { client.send(&by_name, http::Method::GET, "/ok", &[], None).await }).await);
            rows[2].push(
                rate(n, || async {
                    let addr = tokio::net::lookup_host(by_name.authority.as_str())
                        .await
                        .expect("localhost resolves")
                        .next()
                        .expect("an address");
                    let base = BaseUrl::parse(&format!("http://{addr}")).expect("url");
                    client.send(&base, http::Method::GET, "/ok", &[], None).await
                })
                .await,
            );
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let base = median(&mut rows[0]);
        println!("fresh-connection requests: n={n} per row, median of 3 rounds");
        println!("{:<34} {:>12} {:>7}", "server named by", "requests/s", "ratio");
        for (name, row) in ["IP address (baseline)", "host name, kept addresses", "host name, looked up each time"]
            .iter()
            .zip(rows.iter_mut())
        {
            let r = median(row);
            println!("{name:<34} {r:>12.0} {:>7.2}", r / base);
        }
    }

    async fn rate<F, Fut>(n: usize, mut call: F) -> f64
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<dlock_rt::http::ClientResponse, dlock_rt::http::ClientError>>,
    {
        let start = Instant::now();
        for _ in 0..n {
            let r = call().await.expect("answered");
            assert_eq!(r.status, 200);
        }
        n as f64 / start.elapsed().as_secs_f64()
    }
}
