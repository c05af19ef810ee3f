//! What the critical section's machine and its shell say to each other: the [`Event`]s
//! (the typed clients' answers and refusals, read down to what a [`super::PayoutRun`]
//! decides with, and the readings the shell takes) and the [`Command`]s (what the run asks
//! the shell to do, in order). Every type here is plain data, `Clone + Debug + Eq + Hash`,
//! so a run and everything it holds can be compared, hashed and replayed; the readers
//! (`Refusal::of_payment`, `View::of`, `ClaimItem::of`, ...) are pure functions of the
//! clients' own types.

use dlock_contract::fenced::FencedOut;
use dlock_contract::payment::{ClaimAck, ClaimedTerms, PayoutBody};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome};
use dlock_contract::{ErrorCode, IdempotencyKey};
use dlock_rt::probe::Probe;
use uuid::Uuid;

use crate::metrics::Outcome;

/// A payout of a run, as the scan found it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    pub payout_id: Uuid,
    pub state: PayoutState,
}

/// A grant a posted run of the same account kept (a chain, issue 14).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Kept {
    /// Its lock key.
    pub key: String,
    /// Its token.
    pub token: i64,
    /// The payouts the chain has carried so far.
    pub links: u32,
}

/// What a run starts from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Start {
    pub account: String,
    pub members: Vec<Member>,
    /// The grant a posted run of the account kept: the run's first act is a rotate of it
    /// (when short of lease), not an acquire.
    pub chained: Option<Kept>,
    /// Whether the pass holds more of the account after this run (keep the post's grant).
    pub keep: bool,
    /// Whether the task's owner id is a valid `X-Owner-Id`.
    pub owner_valid: bool,
}

/// A payout's terms, as the submission carries them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Terms {
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
}

impl From<ClaimedTerms> for Terms {
    fn from(t: ClaimedTerms) -> Terms {
        Terms {
            account_id: t.account_id,
            amount_minor: t.amount_minor,
            currency: t.currency,
            beneficiary_ref: t.beneficiary_ref,
        }
    }
}

/// A P4 answer, as a run reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View {
    pub state: PayoutState,
    pub terms: Terms,
    /// Its acknowledged attempt: (submissionId, railReference).
    pub acked: Option<(Uuid, String)>,
}

impl View {
    pub fn of(body: &PayoutBody) -> View {
        View {
            state: body.state,
            terms: Terms {
                account_id: body.account_id.clone(),
                amount_minor: body.amount_minor,
                currency: body.currency.clone(),
                beneficiary_ref: body.beneficiary_ref.clone(),
            },
            acked: acked_submission(body),
        }
    }
}

/// The ACKED attempt of a P4 body: (submissionId, railReference).
pub fn acked_submission(view: &PayoutBody) -> Option<(Uuid, String)> {
    view.submissions.iter().find_map(|s| {
        (s.outcome == Some(SubmissionOutcome::Acked)).then_some(())?;
        Some((s.submission_id, s.rail_reference.clone()?))
    })
}

/// A refusal of the payment-resource or the rail-proxy, as a run reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Refusal {
    /// The C3 envelope's code, when one came back.
    pub code: Option<ErrorCode>,
    /// The HTTP status, when an answer came back.
    pub status: Option<u16>,
    /// Sent, and no answer came back (a submission's lost answer): its cause.
    pub lost: Option<String>,
    /// The refusal as the client prints it.
    pub text: String,
    /// Its details, for a `FENCED_OUT` (the contract's type: C3 §3.4).
    pub fence: Option<FencedOut>,
    /// The state a `PAYOUT_NOT_CLAIMABLE` names.
    pub state: Option<PayoutState>,
    /// The submission a `RAIL_AMBIGUOUS` names.
    pub submission_id: Option<String>,
}

impl Refusal {
    pub fn of_payment(r: &dlock_payment_client::PaymentRefusal) -> Refusal {
        let details = r.details();
        Refusal {
            code: r.code(),
            status: r.status(),
            lost: None,
            text: r.to_string(),
            fence: r.fenced_out(),
            state: details
                .and_then(|d| d.get("state"))
                .and_then(serde_json::Value::as_str)
                .and_then(PayoutState::parse),
            submission_id: None,
        }
    }

    pub fn of_rail(r: &dlock_rail_client::RailRefusal) -> Refusal {
        Refusal {
            code: r.code(),
            status: r.status(),
            lost: match r {
                dlock_rail_client::RailRefusal::NoAnswer { cause } => Some(cause.clone()),
                _ => None,
            },
            text: r.to_string(),
            fence: r.fenced_out(),
            state: None,
            submission_id: r.ambiguous_submission_id().map(str::to_owned),
        }
    }
}

/// An acquire or rotate that granted nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockRefusal {
    /// An unknown outcome: the session refuses the key from then on.
    pub ambiguous: bool,
    pub code: Option<ErrorCode>,
    /// The error as the lock client prints it.
    pub text: String,
}

impl LockRefusal {
    pub fn of(e: &dlock_lock_client::LockClientError) -> LockRefusal {
        LockRefusal {
            ambiguous: matches!(e, dlock_lock_client::LockClientError::Ambiguous { .. }),
            code: e.code(),
            text: e.to_string(),
        }
    }
}

/// A batch answer (P2b, R1b, P3b) with its items read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch<I> {
    pub account_id: String,
    pub presented_token: i64,
    pub items: Vec<(Uuid, I)>,
}

impl<I> Batch<I> {
    pub fn of(
        answer: &dlock_contract::batch::BatchAnswer,
        read: impl Fn(&dlock_contract::batch::BatchItem) -> I,
    ) -> Self {
        Batch {
            account_id: answer.account_id.clone(),
            presented_token: answer.presented_token,
            items: answer.items.iter().map(|i| (i.payout_id, read(i))).collect(),
        }
    }

    /// The item of `payout_id`, when the answer is for `account` under `token` (an answer
    /// for anything else is no answer for this payout).
    pub(super) fn item(&self, account: &str, token: i64, payout_id: Uuid) -> Option<&I> {
        if self.account_id != account || self.presented_token != token {
            return None;
        }
        self.items.iter().find(|(p, _)| *p == payout_id).map(|(_, i)| i)
    }
}

/// A P2b item: the claim's terms when it claimed, else its status and code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimItem {
    pub status: u16,
    pub terms: Option<Terms>,
    pub code: Option<ErrorCode>,
}

impl ClaimItem {
    pub fn of(item: &dlock_contract::batch::BatchItem) -> ClaimItem {
        ClaimItem {
            status: item.status,
            terms: item.ok::<ClaimAck>().and_then(|ack| ack.terms()).map(Terms::from),
            code: item.envelope().map(|e| e.code),
        }
    }
}

/// An acknowledged submission: what the post carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Acked {
    pub payout_id: Uuid,
    pub submission_id: Uuid,
    pub rail_reference: String,
}

/// An R1b item: its acknowledgement, or its refusal as the single submission's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubmitItem {
    /// A `SubmissionAck` whose outcome is ACKED, for the payout it names.
    pub acked: Option<Acked>,
    pub refusal: Refusal,
}

impl SubmitItem {
    pub fn of(item: &dlock_contract::batch::BatchItem) -> SubmitItem {
        let acked = item.ok::<SubmissionAck>().and_then(|ack| {
            (ack.outcome == SubmissionOutcome::Acked).then_some(Acked {
                payout_id: ack.payout_id,
                submission_id: ack.submission_id,
                rail_reference: ack.rail_reference,
            })
        });
        let refusal = match item.envelope() {
            Some(envelope) => dlock_rail_client::RailRefusal::Refused { status: item.status, envelope },
            None => {
                dlock_rail_client::RailRefusal::Unreadable { status: item.status, cause: "not a C3 envelope".into() }
            }
        };
        SubmitItem { acked, refusal: Refusal::of_rail(&refusal) }
    }
}

/// A P3b item.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PostItem {
    pub status: u16,
    pub code: Option<ErrorCode>,
}

impl PostItem {
    pub fn of(item: &dlock_contract::batch::BatchItem) -> PostItem {
        PostItem { status: item.status, code: item.envelope().map(|e| e.code) }
    }
}

/// A payout submitted in a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Submission {
    pub payout_id: Uuid,
    pub key: IdempotencyKey,
    pub terms: Terms,
}

/// What the shell tells the run: a client's typed answer, or a reading it took.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event {
    /// The run begins.
    Start,
    /// [`Command::Mark`]: whether no sibling task works the account.
    Marked { free: bool },
    /// [`Command::Acquire`] or [`Command::Rotate`]: the new grant's token, or the refusal.
    Granted(Result<i64, LockRefusal>),
    /// [`Command::GrantLease`]: the grant's own local lease left, in whole ms.
    GrantLease { remaining_ms: u64 },
    /// [`Command::CheckLease`]: whether a fenced write may be sent (the local deadline has
    /// not passed, or the check is off).
    LeaseChecked { may_write: bool },
    /// [`Command::Read`]: the payout, or `None` when the advisory read failed.
    Read(Option<View>),
    /// [`Command::Claim`]: the claim answer's terms (`None` for a replayed answer recorded
    /// without them), or the refusal.
    Claimed(Result<Option<Terms>, Refusal>),
    /// [`Command::ClaimBatch`].
    ClaimedBatch(Result<Batch<ClaimItem>, Refusal>),
    /// [`Command::Submit`], and the rotate sent beside it.
    Submitted { answer: Result<Acked, Refusal>, rotated: Result<i64, LockRefusal> },
    /// [`Command::SubmitBatch`], and the rotate sent beside it.
    SubmittedBatch { answer: Result<Batch<SubmitItem>, Refusal>, rotated: Result<i64, LockRefusal> },
    /// [`Command::Post`], and the rotate sent beside it when the post keeps its grant.
    Posted { answer: Result<(), Refusal>, rotated: Option<Result<i64, LockRefusal>> },
    /// [`Command::PostBatch`], and the rotate sent beside it when the post keeps its grant.
    PostedBatch { answer: Result<Batch<PostItem>, Refusal>, rotated: Option<Result<i64, LockRefusal>> },
}

/// Which write a `FENCED_OUT` refused (the `hop` of `executor_fenced_out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    Claim,
    Submit,
    Post,
}

impl Write {
    pub fn tag(self) -> &'static str {
        match self {
            Write::Claim => "claim",
            Write::Submit => "submit",
            Write::Post => "post",
        }
    }
}

/// What a log record is about: a payout (single), or an account (a whole batch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum About {
    Payout(Uuid),
    Account(String),
}

/// The run's log records, each the shell's one `tracing` event of that name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Log {
    /// `executor_session_reset` (warn).
    SessionReset { key: String, cause: String },
    /// `executor_account_busy` (debug).
    AccountBusy { key: String, cause: String },
    /// `executor_owner_invalid` (error).
    OwnerInvalid,
    /// `executor_fenced_out` (error).
    FencedOut { hop: Write, token: i64, fence: Option<FencedOut> },
    /// `executor_claim_undecided` (warn), for a request.
    ClaimUndecided { about: About, answer: String },
    /// `executor_claim_undecided` (warn), for a batch item.
    ClaimItemUndecided { payout_id: Uuid, status: u16 },
    /// `executor_duplicate_submission` (error).
    DuplicateSubmission { payout_id: Uuid, token: i64 },
    /// `rail_ambiguous` (warn).
    RailAmbiguous { payout_id: Uuid, submission_id: String, token: i64 },
    /// `executor_submission_answer_lost` (warn).
    SubmissionAnswerLost { payout_id: Uuid, cause: String },
    /// `executor_submission_undecided` (warn).
    SubmissionUndecided { payout_id: Uuid, answer: String },
    /// `executor_post_deferred` (info).
    PostDeferred { about: About, cause: String },
    /// `executor_post_undecided` (warn), for a request.
    PostUndecided { about: About, answer: String },
    /// `executor_post_undecided` (warn), for a batch item.
    PostItemUndecided { payout_id: Uuid, status: Option<u16> },
    /// `executor_chain_rotate_failed` (debug).
    ChainRotateFailed { about: About, cause: String },
}

impl Log {
    /// The record's `tracing` event name.
    pub fn name(&self) -> &'static str {
        match self {
            Log::SessionReset { .. } => "executor_session_reset",
            Log::AccountBusy { .. } => "executor_account_busy",
            Log::OwnerInvalid => "executor_owner_invalid",
            Log::FencedOut { .. } => "executor_fenced_out",
            Log::ClaimUndecided { .. } | Log::ClaimItemUndecided { .. } => "executor_claim_undecided",
            Log::DuplicateSubmission { .. } => "executor_duplicate_submission",
            Log::RailAmbiguous { .. } => "rail_ambiguous",
            Log::SubmissionAnswerLost { .. } => "executor_submission_answer_lost",
            Log::SubmissionUndecided { .. } => "executor_submission_undecided",
            Log::PostDeferred { .. } => "executor_post_deferred",
            Log::PostUndecided { .. } | Log::PostItemUndecided { .. } => "executor_post_undecided",
            Log::ChainRotateFailed { .. } => "executor_chain_rotate_failed",
        }
    }
}

/// How the pass goes on after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Worked (or found nothing to do): go on with the next candidate.
    Done,
    /// Its account is busy (a sibling task works it, or the lock server refused the grant):
    /// the pass skips the account's other candidates.
    Busy,
    /// The session must be replaced (an acquire or rotate whose answer was lost).
    Reset,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct End {
    /// Each payout's outcome, in member order (a single payout that needed nothing has none).
    pub outcomes: Vec<(Uuid, Outcome)>,
    pub pass: Pass,
    /// The chain's links when the grant is kept for the account's next run.
    pub kept_links: Option<u32>,
}

/// What the run asks the shell to do, in order. The commands marked "answered" are each
/// answered by the event named; the others are not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    /// Mark the account as worked by this task (answered: [`Event::Marked`]).
    Mark { account: String },
    /// L4, one attempt, queued at most `wait_ms` (answered: [`Event::Granted`]).
    Acquire { key: String, wait_ms: Option<u64> },
    /// Read the held grant's own local lease (answered: [`Event::GrantLease`]).
    GrantLease,
    /// E-18, the held grant rotated, timed as an acquire (answered: [`Event::Granted`]).
    Rotate,
    /// The local lease check before a fenced write (answered: [`Event::LeaseChecked`]).
    CheckLease,
    /// P4, an advisory read (answered: [`Event::Read`]).
    Read { payout_id: Uuid },
    /// P2 under the held grant (answered: [`Event::Claimed`]).
    Claim { payout_id: Uuid, key: IdempotencyKey, expected_state: PayoutState, token: i64 },
    /// P2b under the held grant (answered: [`Event::ClaimedBatch`]).
    ClaimBatch { account: String, key: IdempotencyKey, members: Vec<Member>, token: i64 },
    /// R1 under the held grant, once, with the grant's rotate beside it (answered:
    /// [`Event::Submitted`]).
    Submit { payout_id: Uuid, key: IdempotencyKey, terms: Terms, token: i64 },
    /// R1b under the held grant, once, with the grant's rotate beside it (answered:
    /// [`Event::SubmittedBatch`]).
    SubmitBatch { account: String, submissions: Vec<Submission>, token: i64 },
    /// P3 under the held grant, with its rotate beside it when `rotate` (answered:
    /// [`Event::Posted`]).
    Post { acked: Acked, key: IdempotencyKey, token: i64, rotate: bool },
    /// P3b under the held grant, with its rotate beside it when `rotate`, else the grant
    /// released in the background once it answered (answered: [`Event::PostedBatch`]).
    PostBatch { account: String, key: IdempotencyKey, acked: Vec<Acked>, token: i64, rotate: bool },
    /// L6 of the held grant: awaited in line, or in the background (the task goes on).
    Release { background: bool },
    /// Another executor holds the account: drop its candidates from the shared scan.
    ForgetAccount { account: String },
    /// A `dlock_rt::probe` hit.
    Probe(Probe),
    /// A log record.
    Log(Log),
    /// The run is over.
    Done(End),
}

impl Command {
    /// Whether the shell answers this command with an event.
    pub fn is_answered(&self) -> bool {
        !matches!(
            self,
            Command::Release { .. }
                | Command::ForgetAccount { .. }
                | Command::Probe(_)
                | Command::Log(_)
                | Command::Done(_)
        )
    }
}
