/** The server's failures as the panel shows them: the JSON error body, 429's Retry-After, and network errors. */
import type { Failure } from "./reducer";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly retryAfterS: number | null,
  ) {
    super(message);
  }
}

/** A failed HTTP answer as the panel shows it; 429 carries when the next question is allowed. */
export async function failureOf(response: Response): Promise<Failure> {
  let code = `http_${response.status}`;
  let message = `The server answered ${response.status}.`;
  try {
    const body = (await response.json()) as { error?: { code?: string; message?: string } };
    code = body.error?.code ?? code;
    message = body.error?.message ?? message;
  } catch {
    // not our JSON error shape (a proxy's page): keep the generic message
  }
  const retryAfter = retryAfterOf(response);
  if (response.status === 429) {
    const seconds = retryAfter ?? 60;
    return { code, message, retryable: true, retryAt: Date.now() + seconds * 1000 };
  }
  return { code, message, retryable: response.status >= 500 || response.status === 408 };
}

export function retryAfterOf(response: Response): number | null {
  const raw = response.headers.get("Retry-After");
  return raw && /^\d+$/.test(raw) ? Number(raw) : null;
}

export function isNetworkError(error: unknown): boolean {
  return error instanceof Error && /network|fetch|terminated|aborted|socket/i.test(error.message);
}
