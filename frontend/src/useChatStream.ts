/**
 * The answers' streams: each runs under its own AbortController, its events go to the reducer, and its end
 * (done, a failure, a stop) is told to the reducer once. All of them are cut when the panel unmounts.
 */
import { useCallback, useEffect, useMemo, useRef, type Dispatch } from "react";
import type { ChatClient } from "./client";
import type { ChatRequest } from "./protocol";
import type { Action, AnswerMessage } from "./reducer";

export interface ChatStream {
  /** Stream the answer `answerKey` to `request`; with `from`, follow an answer already being written there. */
  run: (answerKey: string, request: ChatRequest, from?: string | null) => Promise<void>;
  /** Stop the answer being written: the server is asked to (it then ends the stream), or the stream is cut. */
  stop: (answer: AnswerMessage) => Promise<void>;
}

/** How long a stopped answer's stream may take to end by itself before it is cut. */
const STOP_GRACE_MS = 3000;

export function useChatStream(client: ChatClient, dispatch: Dispatch<Action>): ChatStream {
  const controllers = useRef(new Map<string, AbortController>());
  useEffect(() => {
    const running = controllers.current;
    return () => running.forEach((c) => c.abort());
  }, []);

  const run = useCallback(
    async (answerKey: string, request: ChatRequest, from: string | null = null): Promise<void> => {
      const controller = new AbortController();
      controllers.current.set(answerKey, controller);
      try {
        const outcome = await client.stream(
          request,
          {
            onEvent: (event) => dispatch({ type: "event", key: answerKey, event }),
            onReconnecting: () => dispatch({ type: "reconnecting", key: answerKey }),
          },
          controller.signal,
          from,
        );
        if (outcome.kind === "failed" && outcome.failure) {
          dispatch({ type: "failed", key: answerKey, failure: outcome.failure });
        } else {
          // aborted, or a 204 resume (ended while away): a no-op when done already arrived
          dispatch({ type: "cancelled", key: answerKey });
        }
      } catch {
        dispatch({ type: "failed", key: answerKey, failure: { code: "client", message: "Something went wrong.", retryable: true } });
      } finally {
        controllers.current.delete(answerKey);
      }
    },
    [client, dispatch],
  );

  const stop = useCallback(
    async (answer: AnswerMessage): Promise<void> => {
      const controller = controllers.current.get(answer.key);
      const stopped = answer.streamUrl ? await client.stop(answer.streamUrl) : false;
      // The stream ends by itself with done/cancelled after a successful DELETE; otherwise cut it here.
      if (!stopped) controller?.abort();
      else setTimeout(() => controller?.abort(), STOP_GRACE_MS);
    },
    [client],
  );

  return useMemo(() => ({ run, stop }), [run, stop]);
}
