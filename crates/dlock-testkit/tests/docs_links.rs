//! The docs are a book whose links hold (docs/book.toml; mdBook checks no link itself):
//!
//! - every relative link in `README.md`, in every `docs/**/*.md` and in every file a
//!   chapter pulls in with `{{#include …}}` names a file or directory that exists;
//! - every `#anchor` of such a link (or of a link within its own page) is a heading of the
//!   target, slugged as GitHub and mdBook both slug it, or an explicit `<a id="…">`;
//! - every chapter `docs/SUMMARY.md` lists exists, and every page under `docs/` is listed;
//! - a page that includes a file by line ranges (`{{#include file:a:b}}`, to restate the
//!   lines whose links would break once rendered) restates exactly the lines its ranges
//!   skip, each the same text but for its link targets: an edit of the included file that
//!   shifts the ranges is reported instead of rendering wrong lines.
//!
//! Links with a scheme (`https:`, `mailto:`) are not followed. The checker is the plain
//! functions below; the negative tests feed it a broken link, a broken anchor and a page
//! missing from the summary, so the checks are shown to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// The repository root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_HEADING_ATTRIBUTES
}

/// The slug of a heading's text, as GitHub and mdBook (`normalize_id`) make it: letters,
/// digits, `_` and `-` kept and lower-cased, each whitespace character a `-`, everything
/// else dropped.
fn slug(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// A link of a page: its destination and the line it is on.
#[derive(Debug)]
struct Link {
    dest: String,
    line: usize,
}

/// What a page offers and asks: the anchors it defines, the links it makes, the files it
/// includes.
#[derive(Debug, Default)]
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<Link>,
    includes: Vec<Link>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

/// Every `<a id="…">` or `<a name="…">` in a piece of HTML.
fn html_anchors(html: &str, out: &mut BTreeSet<String>) {
    for attr in ["id=\"", "name=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
}

/// Every `{{#include PATH}}` (or `{{#include PATH:…}}`) of a page, with its line.
fn includes(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("{{#include ") {
        let start = from + i + "{{#include ".len();
        let Some(end) = text[start..].find("}}") else { break };
        let arg = text[start..start + end].trim();
        let path = arg.split(':').next().unwrap_or(arg).trim();
        out.push(Link { dest: path.to_owned(), line: line_of(text, start) });
        from = start + end;
    }
    out
}

/// Reads a page: its headings' slugs (numbered `-1`, `-2`, … when repeated, as both
/// renderers number them), explicit anchors, links and includes.
fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut heading: Option<(String, Option<String>)> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { id, .. }) => heading = Some((String::new(), id.map(|i| i.to_string()))),
            Event::End(TagEnd::Heading(_)) => {
                if let Some((words, id)) = heading.take() {
                    let base = id.unwrap_or_else(|| slug(&words));
                    let n = seen.entry(base.clone()).or_insert(0);
                    let anchor = if *n == 0 { base.clone() } else { format!("{base}-{n}") };
                    *n += 1;
                    page.anchors.insert(anchor);
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((words, _)) = heading.as_mut() {
                    words.push_str(&t);
                }
            }
            Event::Html(h) | Event::InlineHtml(h) => html_anchors(&h, &mut page.anchors),
            Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. }) => {
                page.links.push(Link { dest: dest_url.to_string(), line: line_of(text, range.start) });
            }
            _ => {}
        }
    }
    page.includes = includes(text);
    page
}

/// Whether a destination leaves the repository (`https://…`, `mailto:…`).
fn has_scheme(dest: &str) -> bool {
    match dest.find(':') {
        Some(i) => {
            let scheme = &dest[..i];
            !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The pages to check, as paths relative to `root`: `README.md`, every `docs/**/*.md`, and
/// every file those include (transitively).
fn pages_to_check(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    let mut pages = vec![PathBuf::from("README.md")];
    walk(&root.join("docs"), root, &mut pages);
    let mut i = 0;
    while i < pages.len() {
        if let Ok(text) = std::fs::read_to_string(root.join(&pages[i])) {
            let dir = pages[i].parent().unwrap_or(Path::new("")).to_path_buf();
            for inc in includes(&text) {
                let target = normalize(&dir.join(inc.dest.as_str()));
                if target.extension().is_some_and(|e| e == "md")
                    && root.join(&target).is_file()
                    && !pages.contains(&target)
                {
                    pages.push(target);
                }
            }
        }
        i += 1;
    }
    pages
}

/// Every broken link, anchor and include of `pages` (relative to `root`), one line each:
/// `PAGE:LINE: …`. Empty when every one holds.
fn broken_links(root: &Path, pages: &[PathBuf]) -> Vec<String> {
    let mut parsed: BTreeMap<PathBuf, Option<Page>> = BTreeMap::new();
    let mut page_of = |path: &Path| -> Option<BTreeSet<String>> {
        parsed
            .entry(path.to_path_buf())
            .or_insert_with(|| std::fs::read_to_string(root.join(path)).ok().map(|t| parse(&t)))
            .as_ref()
            .map(|p| p.anchors.clone())
    };
    let mut broken = Vec::new();
    for page in pages {
        let Ok(text) = std::fs::read_to_string(root.join(page)) else {
            broken.push(format!("{}: cannot be read", page.display()));
            continue;
        };
        let parsed_page = parse(&text);
        let dir = page.parent().unwrap_or(Path::new("")).to_path_buf();
        for inc in &parsed_page.includes {
            if !root.join(normalize(&dir.join(&inc.dest))).exists() {
                broken.push(format!("{}:{}: includes {}, which does not exist", page.display(), inc.line, inc.dest));
            }
        }
        for link in &parsed_page.links {
            let dest = link.dest.trim();
            if dest.is_empty() {
                broken.push(format!("{}:{}: a link with no target", page.display(), link.line));
                continue;
            }
            if has_scheme(dest) {
                continue;
            }
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest, None),
            };
            let path = path.replace("%20", " ");
            let target = if path.is_empty() { page.clone() } else { normalize(&dir.join(&path)) };
            if path.starts_with('/') || target.starts_with("..") {
                broken.push(format!("{}:{}: {dest} leaves the repository", page.display(), link.line));
                continue;
            }
            if !root.join(&target).exists() {
                broken.push(format!("{}:{}: {dest}: {} does not exist", page.display(), link.line, target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                continue;
            }
            match page_of(&target) {
                Some(anchors) if anchors.contains(anchor) => {}
                Some(_) => broken.push(format!(
                    "{}:{}: {dest}: {} has no heading or anchor #{anchor}",
                    page.display(),
                    link.line,
                    target.display()
                )),
                None => broken.push(format!("{}:{}: {dest}: cannot be read", page.display(), link.line)),
            }
        }
    }
    broken
}

/// The book's structure: every chapter `SUMMARY.md` (in `book_dir`, relative to `root`)
/// lists exists, none is a draft, and every page under `book_dir` is listed. One line per
/// problem.
fn summary_problems(root: &Path, book_dir: &Path) -> Vec<String> {
    let summary_path = book_dir.join("SUMMARY.md");
    let Ok(text) = std::fs::read_to_string(root.join(&summary_path)) else {
        return vec![format!("{} cannot be read", summary_path.display())];
    };
    let mut problems = Vec::new();
    let mut chapters = BTreeSet::new();
    for link in parse(&text).links {
        if link.dest.is_empty() {
            problems.push(format!("{}:{}: a draft chapter (no file)", summary_path.display(), link.line));
            continue;
        }
        let chapter = normalize(&book_dir.join(link.dest.split('#').next().unwrap_or("")));
        if !root.join(&chapter).is_file() {
            problems.push(format!("{}:{}: chapter {} does not exist", summary_path.display(), link.line, link.dest));
        }
        chapters.insert(chapter);
    }
    let pages: Vec<PathBuf> =
        pages_to_check(root).into_iter().filter(|p| p.starts_with(book_dir) && *p != summary_path).collect();
    for page in pages {
        if !chapters.contains(&page) {
            problems.push(format!("{} is not a chapter of {}", page.display(), summary_path.display()));
        }
    }
    problems
}

/// `text` with each inline link (`[label](target)`) as `[]`, for comparing a restated line
/// with the included file's: a restated link may name its target, and so its label, anew.
fn without_targets(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let close = rest[i + 2..].find(')');
        let open = rest[..i].rfind('[');
        match (open, close) {
            (Some(o), Some(j)) => {
                out.push_str(&rest[..o]);
                out.push_str("[]");
                rest = &rest[i + 2 + j + 1..];
            }
            _ => {
                out.push_str(&rest[..i + 2]);
                rest = &rest[i + 2..];
            }
        }
    }
    out.push_str(rest);
    out.trim().to_owned()
}

/// The problems of `page` (its text), which includes files by line ranges relative to
/// `dir`: each gap between two ranges of one file must be restated line for line (the
/// same text but for link targets), and the last range of a file must reach its end.
fn line_range_problems(name: &str, page: &str, dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    // (file, the line the next range must start at, restated lines since the last range)
    let mut open: Option<(String, Vec<String>, usize, Vec<String>)> = None;
    for line in page.lines() {
        let directive = line.trim().strip_prefix("{{#include ").and_then(|r| r.strip_suffix("}}"));
        let Some((file, range)) = directive.and_then(|d| d.split_once(':')) else {
            if let Some((_, _, _, restated)) = open.as_mut() {
                restated.push(line.to_owned());
            }
            continue;
        };
        let (from, to) = range.split_once(':').unwrap_or((range, range));
        let from: usize = from.parse().unwrap_or(1);
        if open.as_ref().is_some_and(|o| o.0 != file) {
            open = None;
        }
        let lines = match &open {
            Some(o) => o.1.clone(),
            None => match std::fs::read_to_string(dir.join(file)) {
                Ok(text) => text.lines().map(str::to_owned).collect(),
                Err(e) => {
                    problems.push(format!("{name}: includes {file}: {e}"));
                    continue;
                }
            },
        };
        if let Some((_, _, next, restated)) = &open {
            let skipped: Vec<String> = lines[(next - 1).min(lines.len())..(from - 1).min(lines.len())].to_vec();
            let restated: Vec<String> = restated.iter().filter(|l| !l.trim().is_empty()).cloned().collect();
            let same = skipped.len() == restated.len()
                && skipped.iter().zip(&restated).all(|(a, b)| without_targets(a) == without_targets(b));
            if !same {
                problems.push(format!(
                    "{name}: {file} lines {next}..{} are restated as {restated:?}, but read {skipped:?}",
                    from - 1
                ));
            }
        }
        if to.is_empty() {
            open = None;
        } else {
            let to: usize = to.parse().unwrap_or(0);
            open = Some((file.to_owned(), lines, to + 1, Vec::new()));
        }
    }
    if let Some((file, lines, next, _)) = open {
        if next <= lines.len() {
            problems.push(format!("{name}: {file}'s last range ends at line {}, before its end", next - 1));
        }
    }
    problems
}

#[test]
fn a_page_including_a_file_by_line_ranges_restates_exactly_the_lines_it_skips() {
    let root = repo_root();
    let mut problems = Vec::new();
    let mut ranged = 0;
    for page in pages_to_check(&root) {
        let text = std::fs::read_to_string(root.join(&page)).expect("a page to check exists");
        if text.lines().any(|l| l.trim().starts_with("{{#include ") && l.matches(':').count() >= 2) {
            ranged += 1;
            let dir = root.join(page.parent().unwrap_or(Path::new("")));
            problems.extend(line_range_problems(&page.display().to_string(), &text, &dir));
        }
    }
    assert!(ranged > 0, "no page includes a file by line ranges: this check would check nothing");
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_shifted_line_range_or_a_wrong_restated_line_is_reported() {
    let dir = std::env::temp_dir().join(format!("docs-links-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("R.md"), "one\ntwo [a](../x.md) end\nthree\n").expect("write");
    let good = "{{#include R.md:1:1}}\ntwo [a](x.md) end\n{{#include R.md:3:}}\n";
    assert_eq!(line_range_problems("good", good, &dir), Vec::<String>::new());
    let shifted = "{{#include R.md:1:1}}\ntwo [a](x.md) end\n{{#include R.md:2:}}\n";
    assert_eq!(line_range_problems("shifted", shifted, &dir).len(), 1);
    let relabelled = "{{#include R.md:1:1}}\ntwo [the x page](x.md) end\n{{#include R.md:3:}}\n";
    assert_eq!(line_range_problems("relabelled", relabelled, &dir), Vec::<String>::new());
    let wrong = "{{#include R.md:1:1}}\ntwo [a](x.md) END\n{{#include R.md:3:}}\n";
    assert_eq!(line_range_problems("wrong", wrong, &dir).len(), 1);
    let short = "{{#include R.md:1:1}}\ntwo [a](x.md) end\n{{#include R.md:3:3}}\n";
    assert_eq!(line_range_problems("short", short, &dir).len(), 0, "the last range reaches line 3, the end");
    let cut = "{{#include R.md:1:1}}\ntwo [a](x.md) end\n";
    assert_eq!(line_range_problems("cut", cut, &dir).len(), 1, "lines 2.. are never included");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_relative_link_in_the_docs_names_an_existing_file_and_heading() {
    let root = repo_root();
    let pages = pages_to_check(&root);
    assert!(pages.len() > 20, "only {} pages found: is docs/ where it was?", pages.len());
    assert!(
        pages.contains(&PathBuf::from("deploy/README.md")),
        "the book's include of deploy/README.md was not followed"
    );
    let broken = broken_links(&root, &pages);
    assert!(broken.is_empty(), "{} broken links:\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn every_page_under_docs_is_a_chapter_of_the_book_and_every_chapter_exists() {
    let problems = summary_problems(&repo_root(), Path::new("docs"));
    assert!(problems.is_empty(), "docs/SUMMARY.md:\n{}", problems.join("\n"));
}

#[test]
fn headings_are_slugged_as_github_and_mdbook_slug_them() {
    assert_eq!(slug("§3.5 The rail-proxy"), "35-the-rail-proxy");
    assert_eq!(slug("E-16 The API description: GET /v1/openapi.json"), "e-16-the-api-description-get-v1openapijson");
    assert_eq!(slug("The lock server's grants"), "the-lock-servers-grants");
    assert_eq!(slug("C-10 Claim, then post: strict < at both"), "c-10-claim-then-post-strict--at-both");
    let page =
        parse("# Title\n\n## `code` and [a link](x.md)\n\n## Title\n\n<a id=\"ct3-x\"></a>\n\n## Custom {#mine}\n");
    let want: BTreeSet<String> =
        ["title", "code-and-a-link", "title-1", "ct3-x", "mine"].into_iter().map(String::from).collect();
    assert_eq!(page.anchors, want);
}

/// A scratch directory of its own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("dlock-docs-links-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("docs/sub")).expect("scratch dir");
        Scratch(dir)
    }

    fn write(&self, path: &str, text: &str) {
        std::fs::write(self.0.join(path), text).expect("write scratch page");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_link_to_a_missing_file_or_a_missing_heading_is_reported() {
    let s = Scratch::new("broken");
    s.write("README.md", "# Top\n\nSee [the guide](docs/guide.md#setup) and [nothing](docs/gone.md).\n");
    s.write(
        "docs/guide.md",
        "# Guide\n\n## Setup\n\n[up](../README.md#top), [self](#set-up), [sub](sub/page.md#page), \
         [web](https://example.com/x#y)\n\n| a | b |\n|---|---|\n| [cell](sub/missing.md) | x |\n",
    );
    s.write("docs/sub/page.md", "# Page\n\n{{#include ../../absent.md}}\n");
    let pages = pages_to_check(&s.0);
    let broken = broken_links(&s.0, &pages);
    let joined = broken.join("\n");
    assert!(joined.contains("README.md:3: docs/gone.md"), "the missing file was not reported: {joined}");
    assert!(joined.contains("docs/guide.md:5: #set-up"), "the missing anchor was not reported: {joined}");
    assert!(joined.contains("sub/missing.md"), "the missing file in a table was not reported: {joined}");
    assert!(joined.contains("includes ../../absent.md"), "the missing include was not reported: {joined}");
    assert_eq!(broken.len(), 4, "only the four broken links are reported: {joined}");
}

#[test]
fn a_page_missing_from_the_summary_or_a_missing_chapter_is_reported() {
    let s = Scratch::new("summary");
    s.write("README.md", "# Top\n");
    s.write("docs/SUMMARY.md", "# Summary\n\n- [Guide](guide.md)\n- [Gone](gone.md)\n- [Draft]()\n");
    s.write("docs/guide.md", "# Guide\n");
    s.write("docs/sub/orphan.md", "# Orphan\n");
    let problems = summary_problems(&s.0, Path::new("docs"));
    let joined = problems.join("\n");
    assert!(joined.contains("chapter gone.md does not exist"), "{joined}");
    assert!(joined.contains("a draft chapter"), "{joined}");
    assert!(joined.contains("docs/sub/orphan.md is not a chapter"), "{joined}");
    assert_eq!(problems.len(), 3, "{joined}");
}
